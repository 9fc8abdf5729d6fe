"""The Lua scripts of :class:`core.cluster.redis_metadata.RedisMetadata` (docs/cluster.md
section 4). Redis runs a script atomically, so each one is a compare-and-set: nothing another
client does can come between its check and its writes.

redis-py's ``register_script`` sends them with ``EVALSHA`` and loads them again on
``NOSCRIPT`` (a restarted Redis or a Sentinel failover to a replica that never saw them). They
touch keys derived from the ``braid:<cluster_id>:`` prefix inside the script (the claim script's
``lease:<old owner>``, the snapshot's ``def:<kind>`` hashes): fine on one Redis with Sentinel,
not on Redis Cluster, which BraidMQ does not use.

Numbers travel as decimal strings; ``tx`` is the apply's random token, kept in every stream
entry it wrote, so a reader can tell a change it has seen from another change that was given
the same version after a failover lost the first.
"""

from __future__ import annotations

from typing import Final

# KEYS[1] version, KEYS[2] changes (stream), KEYS[3] kinds (set of kinds that have a hash),
# KEYS[3 + h] the hash of each kind named by index h below.
# ARGV[1] the `changed` channel, ARGV[2] the stream's MAXLEN, ARGV[3] tx, ARGV[4..6] how many
# expectations, changes and caps follow, then:
#   each expectation: h, field, "1" present / "0" absent, value
#   each change:      h, kind, field, "set" / "del", value ("" for del)
#   each cap:         h, the most fields that hash may hold after the change
# Returns {-1, i}: expectation i failed; {-2, i}: cap i exceeded; {version, prev_tx, i...}:
# applied, i the (1-based) changes that changed something (deleting an absent field does not),
# prev_tx the tx of the stream's entry before this apply. Nothing changed: {version} with the
# version unchanged and nothing written.
CHANGE: Final = """
local version_key, stream, kinds = KEYS[1], KEYS[2], KEYS[3]
local channel, maxlen, tx = ARGV[1], ARGV[2], ARGV[3]
local n_expect, n_changes, n_caps = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local a = 7
for i = 1, n_expect do
  local current = redis.call('HGET', KEYS[3 + tonumber(ARGV[a])], ARGV[a + 1])
  if ARGV[a + 2] == '1' then
    if current ~= ARGV[a + 3] then return {-1, i} end
  elseif current then
    return {-1, i}
  end
  a = a + 4
end
-- A dry run first: which changes change something, and how many fields each hash gains.
local first_change = a
local present, gained, applies, any = {}, {}, {}, false
for i = 1, n_changes do
  local h, field, op = ARGV[a], ARGV[a + 2], ARGV[a + 3]
  local slot = h .. '\\0' .. field
  local was = present[slot]
  if was == nil then was = redis.call('HEXISTS', KEYS[3 + tonumber(h)], field) == 1 end
  if op == 'set' then
    applies[i], present[slot] = true, true
    if not was then gained[h] = (gained[h] or 0) + 1 end
  else
    applies[i], present[slot] = was, false
    if was then gained[h] = (gained[h] or 0) - 1 end
  end
  any = any or applies[i]
  a = a + 5
end
for i = 1, n_caps do
  local h, cap = ARGV[a], tonumber(ARGV[a + 1])
  local more = gained[h] or 0
  if more > 0 and redis.call('HLEN', KEYS[3 + tonumber(h)]) + more > cap then return {-2, i} end
  a = a + 2
end
if not any then return {tonumber(redis.call('GET', version_key) or '0')} end
local prev_tx = ''
local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
if #last > 0 then
  local fields = last[1][2]
  for j = 1, #fields, 2 do
    if fields[j] == 'tx' then prev_tx = fields[j + 1] end
  end
end
local version = redis.call('INCR', version_key)
local result = {version, prev_tx}
local seq = 0
a = first_change
for i = 1, n_changes do
  if applies[i] then
    local hash, kind, field, op = KEYS[3 + tonumber(ARGV[a])], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
    if op == 'set' then
      redis.call('HSET', hash, field, ARGV[a + 4])
      redis.call('SADD', kinds, kind)
    else
      redis.call('HDEL', hash, field)
    end
    redis.call('XADD', stream, 'MAXLEN', '~', maxlen, string.format('%d-%d', version, seq),
      'kind', kind, 'key', field, 'op', op, 'value', ARGV[a + 4], 'tx', tx)
    seq = seq + 1
    result[#result + 1] = i
  end
  a = a + 5
end
redis.call('PUBLISH', channel, version)
return result
"""

# Every definition at one version. KEYS[1] version, KEYS[2] changes, KEYS[3] kinds;
# ARGV[1] the key prefix. Returns {version, tx of that version's entries ("" if trimmed),
# kind, {field, value, ...}, kind, {...}, ...}.
SNAPSHOT: Final = """
local version = tonumber(redis.call('GET', KEYS[1]) or '0')
local tx = ''
local tail = redis.call('XRANGE', KEYS[2], tostring(version), tostring(version), 'COUNT', 1)
if #tail > 0 then
  local fields = tail[1][2]
  for j = 1, #fields, 2 do
    if fields[j] == 'tx' then tx = fields[j + 1] end
  end
end
local out = {version, tx}
for _, kind in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  local hash = ARGV[1] .. 'def:' .. kind
  if string.sub(kind, 1, 6) == 'place:' then hash = ARGV[1] .. kind end
  out[#out + 1] = kind
  out[#out + 1] = redis.call('HGETALL', hash)
end
return out
"""

# KEYS[1] cluster; ARGV[1] format, ARGV[2] shards. Records them when the hash is absent;
# returns the recorded {format, shards} (the caller refuses a mismatch).
CLUSTER: Final = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[1], 'format', ARGV[1], 'shards', ARGV[2],
    'created_ms', string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000)))
end
return redis.call('HMGET', KEYS[1], 'format', 'shards')
"""

# KEYS[1] lease:<node>; ARGV[1] incarnation, ARGV[2] lease_ms. 0: the lease is ours (taken,
# or ours already and extended); otherwise the holder's remaining milliseconds (-1: no expiry,
# -2: it expired just now, try again).
ACQUIRE_LEASE: Final = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 0
end
return redis.call('PTTL', KEYS[1])
"""

# KEYS[1] lease:<node>; ARGV[1] incarnation, ARGV[2] lease_ms. 1 renewed, 0 not ours.
RENEW_LEASE: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# KEYS[1] lease:<node>; ARGV[1] incarnation. 1 released, 0 not ours.
RELEASE_LEASE: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

# claim.lua of section 4. KEYS[1] shard:<n>, KEYS[2] lease:<me>; ARGV[1] key prefix,
# ARGV[2] my node id, ARGV[3] my incarnation, ARGV[4] the epoch the caller read,
# ARGV[5] the `claimed` channel, ARGV[6] the shard number.
# Returns {new epoch} or a refusal: {-1} my lease is not my incarnation's, {-2, owner} another
# node owns it and its lease lives, {-3, epoch} the epoch is not the one the caller read.
CLAIM: Final = """
if redis.call('GET', KEYS[2]) ~= ARGV[3] then return {-1} end
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner and owner ~= ARGV[2] and redis.call('EXISTS', ARGV[1] .. 'lease:' .. owner) == 1 then
  return {-2, owner}
end
local epoch = redis.call('HGET', KEYS[1], 'epoch') or '0'
if epoch ~= ARGV[4] then return {-3, epoch} end
local t = redis.call('TIME')
local new_epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'incarnation', ARGV[3],
  'since_ms', string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000)))
redis.call('PUBLISH', ARGV[5], ARGV[6] .. ' ' .. new_epoch .. ' ' .. ARGV[2])
return {new_epoch}
"""

# KEYS[1] shard:<n>; ARGV[1] an epoch. Raises the recorded epoch to it (section 5.2's EEXIST
# path: an epoch file on disk is higher than Redis remembers); returns the recorded epoch.
SET_EPOCH_AT_LEAST: Final = """
local epoch = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0')
if epoch < tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'epoch', ARGV[1])
  return tonumber(ARGV[1])
end
return epoch
"""
