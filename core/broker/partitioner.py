"""Kafka's default partitioner for keyed records: murmur2(key) & 0x7fffffff % partitions.

Records an AMQP or MQTT client publishes with a key land in the same queue a Kafka producer
(Java client, librdkafka's ``murmur2_random``, kafka-python, aiokafka) would pick, so order per
key holds across protocols.
"""

from __future__ import annotations

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    length = len(data)
    h = (_SEED ^ length) & _MASK
    rounded = length & ~3
    for i in range(0, rounded, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    remaining = length & 3
    if remaining == 3:
        h ^= data[rounded + 2] << 16
    if remaining >= 2:
        h ^= data[rounded + 1] << 8
    if remaining >= 1:
        h ^= data[rounded]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def murmur2_partition(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions
