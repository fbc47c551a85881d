-- fail. ARGV: 1 offset, 2 owner, 3 fence, 4 retention (us), 5 strict 0|1, 6 fence memory (ms),
-- 7 retryable 0|1, 8 message.
-- Answers: {'ok'} | {'rejected', kind, detail} | {'corrupt', reason}.
local retryable = ARGV[7] == '1'
if answer == 'none' then
  -- Gone: a re-sent retryable fail already freed the key.
  if retryable then
    return { 'ok' }
  end
  return { 'rejected', 'not_found' }
end
if answer then
  return answer
end
if s == 'f' and not retryable then
  return { 'ok' }
end
if s ~= 'i' then
  return { 'rejected', 'settled', s }
end
if ARGV[5] == '1' and now >= t then
  return { 'rejected', 'lease_expired' }
end
local memory_ms = tonumber(ARGV[6])
if retryable then
  bury(n, memory_ms)
  return { 'ok' }
end
local expires = now + tonumber(ARGV[4])
local m = struct.pack(SETTLED, 'f', '0', a, n, c, t, expires, ARGV[2], now)
redis.call('HSET', key, 'm', m, 'e', ARGV[8])
redis.call('PEXPIRE', key, ttl_ms(expires, memory_ms))
return { 'ok' }
