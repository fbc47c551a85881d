-- The holder's steps (heartbeat, complete, fail, release): ARGV[2] owner, ARGV[3] fence.
-- Reads the meta of the record the holder presents. Afterwards `answer` is nil when the holder
-- holds a live record (s, z, a, n, c, t, x are set), 'none' when there is no live record, or
-- the answer to give at once (corrupt, or held by another attempt). A settled record keeps the
-- owner and fence of the attempt that settled it. (Straight-line code, not a function: a
-- closure is built on every call of a script.)
local answer, s, z, a, n, c, t, x
local m = redis.pcall('HGET', key, 'm')
if m == false then
  if redis.call('EXISTS', key) == 1 then
    answer = { 'corrupt', 'the hash has no meta field' }
  else
    answer = 'none'
  end
elseif type(m) ~= 'string' then
  answer = { 'corrupt', 'the key does not hold a hash' }
else
  s, z, a, n, c, t, x = unmeta(m)
  if not s then
    answer = { 'corrupt', 'the meta field is garbled' }
  elseif s == '-' or now >= x then
    answer = 'none'
  elseif n ~= tonumber(ARGV[3]) or string.sub(m, 35, 50) ~= ARGV[2] then
    answer = { 'rejected', 'superseded', struct.pack('>I7', n) }
  end
end

