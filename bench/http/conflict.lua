-- wrk script: every request collides with one in-flight request (a 10 s handler under one key):
-- the first runs, every other one is answered 409.
local run = os.time()

function request()
  local headers = { ["Idempotency-Key"] = string.format('"conflict-%d"', run) }
  return wrk.format("POST", "/slow?ms=10000", headers, "")
end
