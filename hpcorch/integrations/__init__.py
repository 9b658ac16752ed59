"""Training libraries as managed pool jobs: ``hpcorch.integrations.transformers`` (the Hugging
Face ``Trainer``) and ``hpcorch.integrations.lightning`` (a Lightning ``Callback``).

Each speaks the runtime's protocol (hpcorch/runtime/launch.py): the start report, steps with
throughput and gradient noise, a checkpoint through the library's own machinery at the next
step boundary after the checkpoint signal and exit code 75, and, on a relaunch at any size,
the global batch of the controller's plan and the exact data position of the checkpoint.
Nothing is imported here: each submodule needs its library (``hpcorch[transformers]``,
``hpcorch[lightning]``).
"""
