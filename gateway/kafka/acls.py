"""Kafka ACLs and SCRAM credentials, kept in the broker's one user store (issue 18).

CreateAcls (30), DescribeAcls (29) and DeleteAcls (31) read and change the Kafka ACLs the core's
authorizer applies beside the vhost permissions (an ALLOW from either grants, a DENY ACL always
wins); DescribeUserScramCredentials (50) and AlterUserScramCredentials (51) the SCRAM
credentials SaslAuthenticate checks (``access.py``). Principals are ``User:<name>`` (``User:*``
for every user); the numbers on the wire are Kafka's (``AclOperation``, ``ResourceType``, ...).

Each of them is the cluster's business: it needs the ``administrator`` tag (or a Kafka ACL
allowing the operation on ``CLUSTER kafka-cluster``), else CLUSTER_AUTHORIZATION_FAILED (31)
for every entry of the request, as Kafka answers. A malformed entry (an unknown operation,
``PREFIXED *``, a principal that is not ``User:``) gets INVALID_REQUEST with the reason, the
others in the same request are done.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from kio.schema.errors import ErrorCode

from core.api import (
    KAFKA_ACL_OPERATION_NUMBERS,
    KAFKA_ACL_PATTERN_TYPE_NUMBERS,
    KAFKA_ACL_PERMISSION_TYPE_NUMBERS,
    KAFKA_ACL_RESOURCE_TYPE_NUMBERS,
    KAFKA_SCRAM_MECHANISM_NUMBERS,
    KafkaAcl,
    KafkaAclFilter,
    SecurityModelError,
)
from gateway.kafka.access import allowed
from gateway.kafka.apis import ApiKey
from gateway.kafka.codec import Request
from gateway.kafka.context import Connection, Handler, KafkaContext, ResponseBody
from gateway.kafka.entities import build_response

log = logging.getLogger(__name__)


def _names(numbers: Mapping[str, int]) -> dict[int, str]:
    return {number: name for name, number in numbers.items()}


RESOURCE_TYPES: Final = _names(KAFKA_ACL_RESOURCE_TYPE_NUMBERS)
PATTERN_TYPES: Final = _names(KAFKA_ACL_PATTERN_TYPE_NUMBERS)
OPERATIONS: Final = _names(KAFKA_ACL_OPERATION_NUMBERS)
PERMISSION_TYPES: Final = _names(KAFKA_ACL_PERMISSION_TYPE_NUMBERS)
SCRAM_MECHANISMS: Final = _names(KAFKA_SCRAM_MECHANISM_NUMBERS)
# Kafka's ResourceNotFound answer for a user without SCRAM credentials (RESOURCE_NOT_FOUND).
RESOURCE_NOT_FOUND: Final = ErrorCode.resource_not_found
_CLUSTER_DENIED: Final = "Cluster authorization failed."


def _word(table: Mapping[int, str], number: int, what: str) -> str:
    word = table.get(number)
    if word is None:
        raise SecurityModelError(f"unknown {what} {number}")
    return word


def _numbers(acl: KafkaAcl) -> dict[str, Any]:
    return {
        "resource_type": KAFKA_ACL_RESOURCE_TYPE_NUMBERS[acl.resource_type],
        "resource_name": acl.resource_name,
        "pattern_type": KAFKA_ACL_PATTERN_TYPE_NUMBERS[acl.pattern_type],
        "principal": acl.principal,
        "host": acl.host,
        "operation": KAFKA_ACL_OPERATION_NUMBERS[acl.operation],
        "permission_type": KAFKA_ACL_PERMISSION_TYPE_NUMBERS[acl.permission_type],
    }


def _filter(item: Any) -> KafkaAclFilter:
    """A DescribeAcls request or a DeleteAcls filter as the store's filter (v0 has no pattern
    type: LITERAL, as Kafka reads it)."""
    return KafkaAclFilter(
        resource_type=_word(RESOURCE_TYPES, item.resource_type_filter, "resource type"),
        resource_name=item.resource_name_filter,
        pattern_type=_word(PATTERN_TYPES, getattr(item, "pattern_type_filter", 3), "pattern type"),
        principal=item.principal_filter,
        host=item.host_filter,
        operation=_word(OPERATIONS, item.operation, "operation"),
        permission_type=_word(PERMISSION_TYPES, item.permission_type, "permission type"),
    )


async def handle_create_acls(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    creations = body.creations
    results: list[dict[str, Any]] = []
    if not allowed(context, connection, "kafka CreateAcls", ""):
        results = [
            {"error_code": ErrorCode.cluster_authorization_failed, "error_message": _CLUSTER_DENIED}
            for _ in creations
        ]
    else:
        valid: list[KafkaAcl] = []
        for item in creations:
            try:
                acl = KafkaAcl(
                    _word(RESOURCE_TYPES, item.resource_type, "resource type"),
                    item.resource_name,
                    _word(PATTERN_TYPES, getattr(item, "resource_pattern_type", 3), "pattern"),
                    item.principal,
                    item.host,
                    _word(OPERATIONS, item.operation, "operation"),
                    _word(PERMISSION_TYPES, item.permission_type, "permission type"),
                )
            except SecurityModelError as error:
                log.info("kafka: %s CreateAcls refused: %s", connection.peer, error)
                results.append(
                    {"error_code": ErrorCode.invalid_request, "error_message": str(error)}
                )
                continue
            valid.append(acl)
            results.append({"error_code": ErrorCode.none, "error_message": None})
        if valid:
            await context.api.create_acls(connection.client, valid)
    return build_response(
        ApiKey.CREATE_ACLS, request.api_version, {"throttle_time": 0, "results": results}
    )


def _grouped(acls: list[KafkaAcl]) -> list[dict[str, Any]]:
    """ACLs as DescribeAcls lists them: one entry per resource pattern."""
    resources: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for acl in acls:
        numbers = _numbers(acl)
        resources.setdefault((acl.resource_type, acl.resource_name, acl.pattern_type), []).append(
            numbers
        )
    return [
        {
            "resource_type": KAFKA_ACL_RESOURCE_TYPE_NUMBERS[kind],
            "resource_name": name,
            "pattern_type": KAFKA_ACL_PATTERN_TYPE_NUMBERS[pattern],
            "acls": descriptions,
        }
        for (kind, name, pattern), descriptions in resources.items()
    ]


async def handle_describe_acls(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    values: dict[str, Any] = {"throttle_time": 0, "error_code": ErrorCode.none}
    if not allowed(context, connection, "kafka DescribeAcls", ""):
        values.update(error_code=ErrorCode.cluster_authorization_failed)
        values["error_message"] = _CLUSTER_DENIED
    else:
        try:
            selected = _filter(request.body)
        except SecurityModelError as error:
            values.update(error_code=ErrorCode.invalid_request, error_message=str(error))
        else:
            found = context.api.describe_acls(connection.client, selected)
            values["resources"] = _grouped(found)
    return build_response(ApiKey.DESCRIBE_ACLS, request.api_version, values)


async def handle_delete_acls(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    results: list[dict[str, Any]] = []
    permitted = allowed(context, connection, "kafka DeleteAcls", "")
    body: Any = request.body
    for item in body.filters:
        if not permitted:
            results.append(
                {
                    "error_code": ErrorCode.cluster_authorization_failed,
                    "error_message": _CLUSTER_DENIED,
                }
            )
            continue
        try:
            selected = _filter(item)
        except SecurityModelError as error:
            results.append({"error_code": ErrorCode.invalid_request, "error_message": str(error)})
            continue
        deleted = await context.api.delete_acls(connection.client, selected)
        results.append(
            {
                "error_code": ErrorCode.none,
                "error_message": None,
                "matching_acls": [
                    {"error_code": ErrorCode.none, "error_message": None, **_numbers(acl)}
                    for acl in deleted
                ],
            }
        )
    return build_response(
        ApiKey.DELETE_ACLS, request.api_version, {"throttle_time": 0, "filter_results": results}
    )


async def handle_describe_user_scram_credentials(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    values: dict[str, Any] = {"throttle_time": 0, "error_code": ErrorCode.none}
    if not allowed(context, connection, "kafka DescribeUserScramCredentials", ""):
        values.update(error_code=ErrorCode.cluster_authorization_failed)
        values["error_message"] = _CLUSTER_DENIED
        return build_response(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, request.api_version, values)
    body: Any = request.body
    # Null or empty both mean every user, as Kafka's ZkAdminManager reads it (librdkafka sends
    # an empty array for describe_user_scram_credentials() without users).
    names = [user.name for user in body.users] if body.users else None
    found = context.api.scram_credentials(connection.client, names)
    results = []
    for name, credentials in found.items():
        if not credentials:
            results.append(
                {
                    "user": name,
                    "error_code": RESOURCE_NOT_FOUND,
                    "error_message": f"Attempt to describe a user credential that does not "
                    f"exist: {name}",
                }
            )
            continue
        results.append(
            {
                "user": name,
                "error_code": ErrorCode.none,
                "error_message": None,
                "credential_infos": [
                    {
                        "mechanism": KAFKA_SCRAM_MECHANISM_NUMBERS[credential.mechanism],
                        "iterations": credential.iterations,
                    }
                    for credential in credentials
                ],
            }
        )
    values["results"] = results
    return build_response(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, request.api_version, values)


async def handle_alter_user_scram_credentials(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    permitted = allowed(context, connection, "kafka AlterUserScramCredentials", "")
    api = context.api
    results: list[dict[str, Any]] = []
    for deletion in body.deletions:
        error, message = ErrorCode.none, None
        mechanism = SCRAM_MECHANISMS.get(deletion.mechanism)
        if not permitted:
            error, message = ErrorCode.cluster_authorization_failed, _CLUSTER_DENIED
        elif mechanism is None:
            error = ErrorCode.unsupported_sasl_mechanism
            message = f"Unknown SCRAM mechanism {deletion.mechanism}"
        elif not await api.delete_scram_credential(connection.client, deletion.name, mechanism):
            error = RESOURCE_NOT_FOUND
            message = f"Attempt to delete a user credential that does not exist: {deletion.name}"
        results.append({"user": deletion.name, "error_code": error, "error_message": message})
    for upsertion in body.upsertions:
        error, message = ErrorCode.none, None
        mechanism = SCRAM_MECHANISMS.get(upsertion.mechanism)
        if not permitted:
            error, message = ErrorCode.cluster_authorization_failed, _CLUSTER_DENIED
        elif mechanism is None:
            error = ErrorCode.unsupported_sasl_mechanism
            message = f"Unknown SCRAM mechanism {upsertion.mechanism}"
        else:
            try:
                await api.upsert_scram_credential(
                    connection.client,
                    upsertion.name,
                    mechanism,
                    bytes(upsertion.salt),
                    bytes(upsertion.salted_password),
                    upsertion.iterations,
                )
            except ValueError as exc:
                # Kafka: iterations outside 4096..16384 are UNACCEPTABLE_CREDENTIAL.
                error, message = ErrorCode.unacceptable_credential, str(exc)
        if error != ErrorCode.none:
            log.info(
                "kafka: %s AlterUserScramCredentials %s: %s",
                connection.peer,
                upsertion.name,
                message,
            )
        results.append({"user": upsertion.name, "error_code": error, "error_message": message})
    return build_response(
        ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
        request.api_version,
        {"throttle_time": 0, "results": results},
    )


HANDLERS: dict[int, Handler] = {
    ApiKey.CREATE_ACLS: handle_create_acls,
    ApiKey.DESCRIBE_ACLS: handle_describe_acls,
    ApiKey.DELETE_ACLS: handle_delete_acls,
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: handle_describe_user_scram_credentials,
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: handle_alter_user_scram_credentials,
}
