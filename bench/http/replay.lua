-- wrk script: every request after the first is a replay of one stored response.
local run = os.time()

function request()
  local headers = {
    ["Idempotency-Key"] = string.format('"replay-%d"', run),
    ["Content-Type"] = "application/json",
  }
  return wrk.format("POST", "/echo", headers, '{"amount":1250,"currency":"eur"}')
end
