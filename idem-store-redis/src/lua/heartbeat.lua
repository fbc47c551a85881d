-- heartbeat. ARGV: 1 offset, 2 owner, 3 fence, 4 extend (us), 5 strict 0|1, 6 fence memory (ms).
-- Answers: {'ok', lease_until} | {'rejected', kind, detail} | {'corrupt', reason}.
local now = now_micros()
local live, answer = holder_record(now)
if answer then
  return answer
end
if not live then
  return { 'rejected', 'not_found' }
end
if live.s ~= 'i' then
  return { 'rejected', 'settled', live.s }
end
if ARGV[5] == '1' and now >= live.l then
  return { 'rejected', 'lease_expired' }
end
local extend = tonumber(ARGV[4])
local lease_until = now + extend
if live.l > lease_until then
  lease_until = live.l
end
local expires = lease_until + extend
redis.call('HSET', key, 'l', fmt(lease_until), 'x', fmt(expires))
redis.call('PEXPIRE', key, ttl_ms(expires, now, tonumber(ARGV[6])))
return { 'ok', fmt(lease_until) }
