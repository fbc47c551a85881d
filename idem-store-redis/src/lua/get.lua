-- get. ARGV: 1 offset.
-- Answers: {'record', now, fields...} | {'none', now} | {'corrupt', reason}.
local now = now_micros()
local rec, raw, bad = load()
if bad then
  return { 'corrupt', bad }
end
if rec == nil or rec.tomb or now >= rec.x then
  return { 'none', fmt(now) }
end
return with_record('record', now, raw)
