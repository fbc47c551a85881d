-- heartbeat. ARGV: 1 offset, 2 owner, 3 fence, 4 extend (us), 5 strict 0|1, 6 fence memory (ms).
-- Answers: {'ok', meta} | {'rejected', kind, detail} | {'corrupt', reason}.
if answer == 'none' then
  return { 'rejected', 'not_found' }
end
if answer then
  return answer
end
if s ~= 'i' then
  return { 'rejected', 'settled', s }
end
if ARGV[5] == '1' and now >= t then
  return { 'rejected', 'lease_expired' }
end
local extend = tonumber(ARGV[4])
local lease_until = now + extend
if t > lease_until then
  lease_until = t
end
local expires = lease_until + extend
local m = struct.pack(HELD, 'i', '0', a, n, c, lease_until, expires, ARGV[2])
redis.call('HSET', key, 'm', m)
redis.call('PEXPIRE', key, ttl_ms(expires, tonumber(ARGV[6])))
return { 'ok', m }
