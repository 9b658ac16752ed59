from hpcorch.cli import main

main()
