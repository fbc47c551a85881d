-- get. ARGV: 1 offset.
-- Answers: {'record', now, fields...} | {'none', now} | {'corrupt', reason}.
local raw = redis.pcall('HGETALL', key)
if raw.err then
  return { 'corrupt', 'the key does not hold a hash' }
end
local stamp = struct.pack('>I7', now)
if #raw == 0 then
  return { 'none', stamp }
end
local m
for i = 1, #raw, 2 do
  if raw[i] == 'm' then
    m = raw[i + 1]
  end
end
if not m then
  return { 'corrupt', 'the hash has no meta field' }
end
local s, _, _, _, _, _, x = unmeta(m)
if not s then
  return { 'corrupt', 'the meta field is garbled' }
end
if s == '-' or now >= x then
  return { 'none', stamp }
end
-- Not `unpack(raw)`: it fails on a hash with thousands of (foreign) fields.
table.insert(raw, 1, stamp)
table.insert(raw, 1, 'record')
return raw
