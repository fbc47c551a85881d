-- idem: shared by every script. KEYS[1] is the record's hash; ARGV[1] is an offset in
-- microseconds added to the server's clock (0 outside tests).
--
-- A record (see src/layout.rs) is a HASH of:
--   m      the meta, packed big-endian: state ('i' in flight, 'c' completed, 'f' failed, '-'
--          tombstone), result codec ('0' as is, '1' lz4), attempt, fence, created_at,
--          lease_until, expires_at (struct '>c1c1I4I7I7I7I7', 34 bytes: a tombstone), then the
--          owner token (50 bytes: in flight), then completed_at (57 bytes: settled), all times
--          in microseconds of the server's clock. A settled record keeps the owner and the
--          lease of the attempt that settled it, as idem-core's machine leaves them.
--   p      the fingerprint (32 bytes);    k, g  the key and scope as given (g only if any);
--   e      a failed record's message;     0, 1, ...  a completed record's result, in pieces.
-- A tombstone is a hash of m alone, kept for the fence memory so fences keep rising.
-- Numbers in answers are packed the same way ('>I7'): no text formatting in here.
local key = KEYS[1]
local META = '>c1c1I4I7I7I7I7'
local HELD = '>c1c1I4I7I7I7I7c16'
local SETTLED = '>c1c1I4I7I7I7I7c16I7'
local clock = redis.call('TIME')
-- Integers are doubles in Lua: every number here stays below 2^53 (the store clamps durations).
local now = clock[1] * 1000000 + clock[2] + ARGV[1]

-- The lengths of the meta by state: a tombstone, in flight, settled.
local META_LEN = { ['-'] = 34, i = 50, c = 57, f = 57 }

-- The meta m unpacked (state, codec, attempt, fence, created, lease end, expiry), or nil when
-- m is not a meta this version writes. The owner is string.sub(m, 35, 50).
local function unmeta(m)
  if #m < 34 then
    return nil
  end
  local s, z, a, n, c, t, x = struct.unpack(META, m)
  if n < 1 or META_LEN[s] ~= #m then
    return nil
  end
  return s, z, a, n, c, t, x
end

-- The physical TTL in milliseconds: the record's own expiry plus the time its fence is
-- remembered.
local function ttl_ms(expires, memory_ms)
  local ms = math.ceil((expires - now) / 1000)
  if ms < 0 then
    ms = 0
  end
  return ms + memory_ms + 1
end

