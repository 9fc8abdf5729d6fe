"""The Kafka APIs this broker speaks, the version range of each, and the ApiVersions answer.

``SUPPORTED_APIS`` is what the ApiVersions response advertises and what ``KafkaDecoder``
accepts; a request outside it is answered as the Kafka broker answers it (see ``codec``).

How the table was chosen. A client sends, per API, ``min(client max, broker max)`` (aiokafka
takes the highest of its own request classes inside the broker's range), so a broker max only
matters up to the highest client max. Client maxima measured in the installed clients:

================== ======== ============ ============ ============== ==========
API (key)           kio       aiokafka      kafka-python  librdkafka 2.x  ours
================== ======== ============ ============ ============== ==========
Produce (0)         3-13      7             9             10              3-10
Fetch (1)           4-18      11            12            16              4-12
ListOffsets (2)     1-11      3             11            7               1-7
Metadata (3)        0-13      5             13            13              0-9
OffsetCommit (8)    2-10      3             8             9               2-8
OffsetFetch (9)     1-10      3             8             9               1-7
FindCoordinator(10) 0-6       1             6             2               0-4
JoinGroup (11)      0-9       5             7             5               0-7
Heartbeat (12)      0-4       1             4             3               0-4
LeaveGroup (13)     0-5       1             5             1               0-5
SyncGroup (14)      0-5       3             5             3               0-5
DescribeGroups (15) 0-6       3             6             5               0-5
ListGroups (16)     0-5       1             5             5               0-5
SaslHandshake (17)  0-1       1             1             1               0-1
ApiVersions (18)    0-4       0 (first)     4 (first)     3 (first)       0-4
CreateTopics (19)   2-7       3             7             4               2-6
DeleteTopics (20)   1-6       3             6             4               1-5
InitProducerId (22) 0-6       0             4             4               0-4
OffsetForLeaderEpoch 2-4      -             4             2               2-4
AddPartitionsToTxn  0-5       0             3             0               0-3
AddOffsetsToTxn     0-4       0             3             0               0-3
EndTxn (26)         0-5       0             3             1               0-3
TxnOffsetCommit(28) 0-5       0             3             3               0-3
DescribeConfigs(32) 1-4       2             4             1               1-4
AlterConfigs (33)   0-2       1             2             2               0-2
SaslAuthenticate    0-2       1             2             1               0-2
CreatePartitions    0-3       1             3             2               0-3
DeleteGroups (42)   0-2       1             2             2               0-2
IncrAlterConfigs 44 0-1       -             1             1               0-1
DescribeCluster(60) 0-2       -             2             (admin)         0-1
DeleteRecords (21)  0-2       -             2             (admin)         0-2
DescribeLogDirs 35  1-5       -             5             -               1-4
ElectLeaders (43)   0-2       -             2             (admin)         0-2
AlterPartReassign45 0-1       -             1             -               0-1
ListPartReassign 46 0         -             0             -               0
OffsetDelete (47)   0         -             0             (admin)         0
DescribeProducers61 0         -             0             -               0
DescribeTxns (65)   0         -             0             -               0
ListTransactions 66 0-2       -             2             -               0-2
================== ======== ============ ============ ============== ==========

(aiokafka 0.14: the ``_CLASSES`` of each ``aiokafka.protocol`` request; kafka-python 3.0: the
``validVersions`` of its JSON schemas capped by the ``max_version=`` its callers pass;
librdkafka: the ``rd_kafka_broker_ApiVersion_supported(rkb, key, min, max)`` calls in
``rdkafka_request.c``/``rdkafka_fetcher.c``/``rdkafka_msgset_writer.c``.)

Observed against this table with a stub broker built on ``codec`` (aiokafka 0.14.0,
kafka-python 3.0.12, confluent-kafka 2.16.1 / librdkafka 2.16.0, producing and fetching):
aiokafka sends ApiVersions 0, Metadata 5, Produce 7, ListOffsets 3, Fetch 11; kafka-python
ApiVersions 4, Metadata 9, InitProducerId 4, Produce 9, ListOffsets 7, Fetch 12; librdkafka
ApiVersions 3, Metadata 9, Produce 10, FindCoordinator 2, OffsetForLeaderEpoch 2, Fetch 12.
With ApiVersions capped below a client's first version, kafka-python retried at the
advertised max and librdkafka at v0, both after our KIP-511 answer.

Rules that set the bounds:

- Minimum = kio's minimum, which is the Kafka 4.x baseline (KIP-896 dropped older versions);
  every aiokafka maximum above is inside it, so aiokafka always finds a version.
- No topic IDs (KIP-516) anywhere: Metadata stops at 9 (v10+ returns topic IDs and librdkafka
  keys its metadata cache by them), Fetch at 12 (v13+ names topics by ID), CreateTopics at 6
  (v7 returns IDs), DeleteTopics at 5 (v6 accepts IDs), OffsetCommit/OffsetFetch below 10,
  Produce below 13.
- No KIP-848 (next-gen consumer groups) or KIP-890 (transactions v2) versions: OffsetCommit
  stops at 8 and OffsetFetch at 7 (v8 batches several groups in one request, v9 carries a member
  epoch), InitProducerId at 4, AddPartitionsToTxn at 3 (v4 is the broker-to-broker batched
  form), AddOffsetsToTxn/EndTxn/TxnOffsetCommit at 3. Without ConsumerGroupHeartbeat in the table
  librdkafka stays on the classic group protocol.
- Message format v2 only: Produce >= 3 and Fetch >= 4 are what librdkafka needs before it writes
  RecordBatch v2 instead of the legacy MessageSet (its ``RD_KAFKA_FEATURE_MSGVER2``); Produce >= 7
  with Fetch >= 10 also turns on its zstd support (``RD_KAFKA_FEATURE_ZSTD``).
- Produce 10 (KIP-951 adds only tagged response fields) is librdkafka's max; 11/12 announce
  KIP-890 semantics. ListOffsets stops at 7 (v8+ are the tiered-storage timestamps -4/-5).
  FindCoordinator stops at 4 (v4 batches keys, KIP-699, answered key by key; v5 only adds
  KIP-890's TRANSACTION_ABORTABLE, v6 KIP-932's share groups).
  JoinGroup stops at 7 (v8 adds a reason, v9 the KIP-814 skip-assignment flag).
  DescribeCluster stops at 1 (v2 reports fenced brokers). DescribeGroups stops at 5 (v6 reports
  KIP-848 groups).
- SaslHandshake 0-1, though only v1 logs in: v0 means the SASL tokens follow as raw
  size-prefixed frames without a request header, which ``KafkaDecoder`` does not decode, so a
  v0 handshake is answered UNSUPPORTED_VERSION (``access.py``). v0 is in the range because
  librdkafka before 2.10 (kcat 1.7's 2.0.2) turns SASL on only when the range has v0 (its
  ``RD_KAFKA_FEATURE_SASL_HANDSHAKE`` depends on SaslHandshake 0-0), and then sends v1;
  Redpanda advertises 0-1 too.
- AlterConfigs 0-2 and IncrementalAlterConfigs 0-1: every version kio has, and each client's
  max (the newer versions only changed encoding); they set a consumer group's tag filter
  (resource type GROUP, ``admin.py``). librdkafka reads configs with DescribeConfigs v1.
- DescribeAcls/CreateAcls/DeleteAcls 1-3 (kio has no v0; v1 added PREFIXED patterns, which every
  client sends since Kafka 2.0), DescribeUserScramCredentials and AlterUserScramCredentials 0
  (the only versions): ``acls.py``.
- The admin APIs of issue 19 (``admin_records.py``, ``admin_cluster.py``): every version kio
  has, except DescribeLogDirs 5 (KIP-1066's ``is_cordoned`` log directories, a Kafka 4.1 idea).
- ApiVersions 0-4 (v3 is flexible and carries the client software name; v4 only lifts the
  ban on a 0 feature min version). A newer ApiVersions gets the KIP-511 fallback in ``codec``.
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Mapping
from typing import Final

from kio.schema.api_versions.v0 import response as v0
from kio.schema.api_versions.v1 import response as v1
from kio.schema.api_versions.v2 import response as v2
from kio.schema.api_versions.v3 import response as v3
from kio.schema.api_versions.v4 import response as v4
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32Timedelta


class ApiKey(enum.IntEnum):
    """Kafka API keys (``clients/src/main/resources/common/message/*Request.json``)."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    OFFSET_DELETE = 47
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66


# (min_version, max_version), both inclusive. Reasons per row in the module docstring.
SUPPORTED_APIS: Final[dict[int, tuple[int, int]]] = {
    ApiKey.PRODUCE: (3, 10),
    ApiKey.FETCH: (4, 12),
    ApiKey.LIST_OFFSETS: (1, 7),
    ApiKey.METADATA: (0, 9),
    ApiKey.OFFSET_COMMIT: (2, 8),
    ApiKey.OFFSET_FETCH: (1, 7),
    ApiKey.FIND_COORDINATOR: (0, 4),
    ApiKey.JOIN_GROUP: (0, 7),
    ApiKey.HEARTBEAT: (0, 4),
    ApiKey.LEAVE_GROUP: (0, 5),
    ApiKey.SYNC_GROUP: (0, 5),
    ApiKey.DESCRIBE_GROUPS: (0, 5),
    ApiKey.LIST_GROUPS: (0, 5),
    ApiKey.SASL_HANDSHAKE: (0, 1),
    ApiKey.API_VERSIONS: (0, 4),
    ApiKey.CREATE_TOPICS: (2, 6),
    ApiKey.DELETE_TOPICS: (1, 5),
    ApiKey.INIT_PRODUCER_ID: (0, 4),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (2, 4),
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 3),
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 3),
    ApiKey.END_TXN: (0, 3),
    ApiKey.TXN_OFFSET_COMMIT: (0, 3),
    ApiKey.DESCRIBE_ACLS: (1, 3),
    ApiKey.CREATE_ACLS: (1, 3),
    ApiKey.DELETE_ACLS: (1, 3),
    ApiKey.DESCRIBE_CONFIGS: (1, 4),
    ApiKey.ALTER_CONFIGS: (0, 2),
    ApiKey.SASL_AUTHENTICATE: (0, 2),
    ApiKey.CREATE_PARTITIONS: (0, 3),
    ApiKey.DELETE_GROUPS: (0, 2),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 1),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
    ApiKey.DESCRIBE_CLUSTER: (0, 1),
    ApiKey.DELETE_RECORDS: (0, 2),
    ApiKey.DESCRIBE_LOG_DIRS: (1, 4),
    ApiKey.ELECT_LEADERS: (0, 2),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: (0, 1),
    ApiKey.LIST_PARTITION_REASSIGNMENTS: (0, 0),
    ApiKey.OFFSET_DELETE: (0, 0),
    ApiKey.DESCRIBE_PRODUCERS: (0, 0),
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
    ApiKey.LIST_TRANSACTIONS: (0, 2),
}

# ApiVersions request versions from which the request (and so its header) is flexible:
# ApiVersionsRequest.json "flexibleVersions": "3+". Needed to read the header of an ApiVersions
# request newer than any schema we have (KIP-511).
API_VERSIONS_FIRST_FLEXIBLE: Final = 3

ApiVersionsResponse = (
    v0.ApiVersionsResponse
    | v1.ApiVersionsResponse
    | v2.ApiVersionsResponse
    | v3.ApiVersionsResponse
    | v4.ApiVersionsResponse
)


def api_versions_response(
    version: int,
    *,
    error_code: ErrorCode = ErrorCode.none,
    throttle_time_ms: int = 0,
    supported: Mapping[int, tuple[int, int]] = SUPPORTED_APIS,
) -> ApiVersionsResponse:
    """The ApiVersions response body of ``version`` advertising ``supported``.

    With ``error_code=UNSUPPORTED_VERSION`` the list holds only the ApiVersions range, as the
    Kafka broker sends it (``ApiVersionsRequest.getErrorResponse``): the client retries with
    the highest ApiVersions version it finds there (KIP-511).
    """
    if error_code == ErrorCode.unsupported_version:
        supported = {ApiKey.API_VERSIONS: supported[ApiKey.API_VERSIONS]}
    ranges = sorted(supported.items())
    if version == 0:
        return v0.ApiVersionsResponse(
            error_code=error_code,
            api_keys=tuple(
                v0.ApiVersion(api_key=i16(key), min_version=i16(lo), max_version=i16(hi))
                for key, (lo, hi) in ranges
            ),
        )
    throttle = i32Timedelta.parse(datetime.timedelta(milliseconds=throttle_time_ms))
    if version == 1:
        return v1.ApiVersionsResponse(
            error_code=error_code,
            api_keys=tuple(
                v1.ApiVersion(api_key=i16(key), min_version=i16(lo), max_version=i16(hi))
                for key, (lo, hi) in ranges
            ),
            throttle_time=throttle,
        )
    if version == 2:
        return v2.ApiVersionsResponse(
            error_code=error_code,
            api_keys=tuple(
                v2.ApiVersion(api_key=i16(key), min_version=i16(lo), max_version=i16(hi))
                for key, (lo, hi) in ranges
            ),
            throttle_time=throttle,
        )
    if version == 3:
        return v3.ApiVersionsResponse(
            error_code=error_code,
            api_keys=tuple(
                v3.ApiVersion(api_key=i16(key), min_version=i16(lo), max_version=i16(hi))
                for key, (lo, hi) in ranges
            ),
            throttle_time=throttle,
        )
    if version == 4:
        return v4.ApiVersionsResponse(
            error_code=error_code,
            api_keys=tuple(
                v4.ApiVersion(api_key=i16(key), min_version=i16(lo), max_version=i16(hi))
                for key, (lo, hi) in ranges
            ),
            throttle_time=throttle,
        )
    raise ValueError(f"no ApiVersions response schema for version {version}")
