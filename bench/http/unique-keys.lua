-- wrk script: every request a first execution (a key no request used before).
-- Keys are "<run>-<thread>-<n>", so threads and runs never collide.
local counter = 0
local thread_id = 0
local run = os.time()

function setup(thread)
  thread_id = thread_id + 1
  thread:set("tid", thread_id)
end

function init(args)
  tid = tid or 0
end

function request()
  counter = counter + 1
  local headers = {
    ["Idempotency-Key"] = string.format('"%d-%d-%d"', run, tid, counter),
    ["Content-Type"] = "application/json",
  }
  return wrk.format("POST", "/echo", headers, '{"amount":1250,"currency":"eur"}')
end
