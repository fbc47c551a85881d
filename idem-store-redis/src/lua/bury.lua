-- Removes the record, keeping only its fence for memory_ms, so the next grant's fence is higher
-- even if the server clock has not moved (or moved back).
local function bury(fence, memory_ms)
  redis.call('DEL', key)
  if memory_ms > 0 then
    redis.call('HSET', key, 'm', struct.pack(META, '-', '0', 0, fence, 0, 0, 0))
    redis.call('PEXPIRE', key, memory_ms)
  end
end

