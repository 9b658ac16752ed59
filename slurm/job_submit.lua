--[[
job_submit.lua: Slurm keeps an hpcorch pool closed: only jobs the controller places run in it.

Install it beside slurm.conf with `JobSubmitPlugins=lua`, and list the pool's reservation
and the controller's account in hpcorch-pool.conf, also beside slurm.conf:

    # reservations the hpcorch controller alone places jobs in (Lua patterns, one a line)
    reservation ^hpcorch$
    # who may do anything with them: root always, and the controller's service account
    admin_uid 990

Then, for a job in (or moving into) such a reservation, a user other than root or an
admin_uid:
  * may submit it only held and tagged as hpcorch's (`hpcorch submit` does both: sbatch
    --hold, --comment=hpcorch:...); anything else (plain sbatch/srun/salloc) is refused
    with one line naming what to do;
  * may submit only a batch job that Slurm can requeue: the pool's contract (the
    controller resizes and preempts a job by asking it to checkpoint through its batch
    script, then requeueing it). An interactive allocation (salloc, srun, even held and
    tagged) and `--no-requeue` are refused with one line each;
  * may not make a pool job unrequeueable (scontrol update Requeue=0);
  * may not release it, or set its priority: the controller starts it (scontrol release
    is refused with one line; `scontrol hold`/`uhold` stay allowed);
  * may not move a job into the reservation (scontrol update ReservationName=...).
Everything else (comments, names, cancelling, jobs outside the pools) is left alone.
Works with Slurm 22.05 to 25.11 (Lua 5.1 to 5.4). Reloaded by `scontrol reconfigure`.
]]

local TAG = "hpcorch:"
local NO_VAL = 4294967294 -- Slurm's "not set" for a 32-bit field
-- An update refused: Slurm 22.05's scontrol prints only the error code's text, not the
-- line logged for the user (25.11's prints both), so the code says what happened.
local DENIED = slurm.ESLURM_ACCESS_DENIED or slurm.ERROR
local patterns = {}
local admins = { [0] = true }

local function load_config()
  -- beside this script (Slurm loads it from the directory of slurm.conf)
  local source = debug.getinfo(1, "S").source or ""
  local dir = string.match(source, "^@(.*)/[^/]*$") or "/etc/slurm"
  local path = dir .. "/hpcorch-pool.conf"
  local f = io.open(path, "r")
  if not f then
    slurm.log_info("hpcorch job_submit: no %s: no pool is closed", path)
    return
  end
  for line in f:lines() do
    local key, value = string.match(line, "^%s*(%S+)%s+(%S+)%s*$")
    if key == "reservation" then
      table.insert(patterns, value)
    elseif key == "admin_uid" and tonumber(value) then
      admins[tonumber(value)] = true
    end
  end
  f:close()
  slurm.log_info("hpcorch job_submit: %d closed pool pattern(s) from %s", #patterns, path)
end

load_config()

-- the closed reservation a reservation list names ("a,b" since 23.02), or nil
local function closed(reservations)
  if reservations == nil or reservations == "" then
    return nil
  end
  for name in string.gmatch(reservations, "[^,]+") do
    for _, p in ipairs(patterns) do
      if string.find(name, p) then
        return name
      end
    end
  end
  return nil
end

local function is_admin(uid)
  return admins[tonumber(uid) or -1] == true
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local pool = closed(job_desc.reservation)
  if pool == nil or is_admin(submit_uid) then
    return slurm.SUCCESS
  end
  local comment = job_desc.comment or ""
  if job_desc.priority ~= 0 or string.sub(comment, 1, #TAG) ~= TAG then
    slurm.log_user(
      "reservation %s is the hpcorch pool: only its controller places jobs there; submit with 'hpcorch submit'",
      pool
    )
    return slurm.ERROR
  end
  if job_desc.script == nil or job_desc.script == "" then
    slurm.log_user(
      "reservation %s is the hpcorch pool: it runs batch jobs only, no salloc or srun allocations (the controller must be able to ask a job to checkpoint and requeue it); submit with 'hpcorch submit'",
      pool
    )
    return slurm.ERROR
  end
  if job_desc.requeue == 0 then
    slurm.log_user(
      "reservation %s is the hpcorch pool: its jobs must be requeueable (no --no-requeue): the controller resizes and preempts them by requeueing",
      pool
    )
    return slurm.ERROR
  end
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  if is_admin(modify_uid) then
    return slurm.SUCCESS
  end
  local into = closed(job_desc.reservation)
  if into ~= nil and closed(job_rec.resv_name) ~= into then
    slurm.log_user("reservation %s is the hpcorch pool: only its controller moves jobs into it", into)
    return DENIED
  end
  local pool = closed(job_rec.resv_name)
  if pool ~= nil and job_desc.requeue == 0 then
    slurm.log_user("job %d is in the hpcorch pool %s: it must stay requeueable (Requeue=0 refused): the controller resizes and preempts its jobs by requeueing", job_rec.job_id, pool)
    return DENIED
  end
  local prio = job_desc.priority
  if pool ~= nil and prio ~= nil and prio ~= 0 and prio ~= NO_VAL then
    slurm.log_user("job %d is in the hpcorch pool %s: its controller starts it, not scontrol release", job_rec.job_id, pool)
    return DENIED
  end
  return slurm.SUCCESS
end

slurm.log_info("hpcorch job_submit: loaded")
return slurm.SUCCESS
