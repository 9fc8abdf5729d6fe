"""``GET|POST /api/definitions[/{vhost}]``: export and import in RabbitMQ's format, users with
their RabbitMQ password hashes included (tag ``administrator``)."""

from __future__ import annotations

import logging

from aiohttp import web

from braid.web.auth import REQUEST_USER
from braid.web.rabbit.base import ResourceBase
from braid.web.rabbit.common import (
    PRODUCT_NAME,
    RABBIT_COMPAT_VERSION,
    Json,
    bad_request,
    braid_version,
    json_response,
    node_name,
    not_found,
    read_json,
)
from core.security import SecurityError
from core.security.model import TAG_ADMINISTRATOR, TopicPermission, VhostPermission
from core.security.passwords import PasswordHash, PasswordHashError
from gateway.amqp.vhost import BUILTIN_EXCHANGES

log = logging.getLogger(__name__)


class DefinitionResources(ResourceBase):
    async def definitions(self, request: web.Request, segments: list[str]) -> web.StreamResponse:
        self._allow(request, {"GET", "POST"})
        self._require(request, TAG_ADMINISTRATOR)
        if len(segments) > 2:
            raise not_found()
        only = segments[1] if len(segments) == 2 else None
        if only is not None:
            self._check_vhost(request, only)
        if request.method == "POST":
            body = await read_json(request)
            await self.import_definitions(request, body, only)
            return web.Response(status=204)
        return json_response(self.export_definitions(request, only))

    def export_definitions(self, request: web.Request, only: str | None) -> Json:
        context = self.context(request)
        vhosts = [only] if only is not None else list(self.security.vhosts)
        store = self.security.store
        builtin = {name for name, _type in BUILTIN_EXCHANGES}
        exchanges = [
            {
                key: e[key]
                for key in (
                    "name",
                    "vhost",
                    "type",
                    "durable",
                    "auto_delete",
                    "internal",
                    "arguments",
                )
            }
            for e in self.exchanges_of(context, vhosts)
            if e["name"] and e["name"] not in builtin
        ]
        queues = [
            {key: q[key] for key in ("name", "vhost", "durable", "auto_delete", "arguments")}
            for q in self.queues_of(context, vhosts)
            if not q["exclusive"]
        ]
        bindings = [
            {
                key: b[key]
                for key in (
                    "source",
                    "vhost",
                    "destination",
                    "destination_type",
                    "routing_key",
                    "arguments",
                )
            }
            for b in self.bindings_of(context, vhosts, with_default=False)
        ]
        if only is not None:  # RabbitMQ's per-vhost export has no users or vhosts
            for item in (*exchanges, *queues, *bindings):
                item.pop("vhost", None)
            return {
                "rabbit_version": RABBIT_COMPAT_VERSION,
                "rabbitmq_version": RABBIT_COMPAT_VERSION,
                "product_name": PRODUCT_NAME,
                "product_version": braid_version(),
                "parameters": [],
                "policies": [],
                "queues": queues,
                "exchanges": exchanges,
                "bindings": bindings,
            }
        return {
            "rabbit_version": RABBIT_COMPAT_VERSION,
            "rabbitmq_version": RABBIT_COMPAT_VERSION,
            "product_name": PRODUCT_NAME,
            "product_version": braid_version(),
            "users": [
                {
                    "name": user.name,
                    "password_hash": user.password.value,
                    "hashing_algorithm": user.password.algorithm,
                    "tags": list(user.tags),
                    "limits": {},
                }
                for user in store.users()
            ],
            "vhosts": [{"name": vhost, "limits": [], "metadata": {}} for vhost in vhosts],
            "permissions": [
                {"user": user, "vhost": vhost, **permission.to_json()}
                for vhost, user, permission in store.permissions()
            ],
            "topic_permissions": [
                {"user": user, "vhost": vhost, **permission.to_json()}
                for vhost, user, permission in store.topic_permissions()
            ],
            "parameters": [],
            "global_parameters": [{"name": "cluster_name", "value": node_name()}],
            "policies": [],
            "queues": queues,
            "exchanges": exchanges,
            "bindings": bindings,
        }

    async def import_definitions(self, request: web.Request, body: Json, only: str | None) -> None:
        """Users, permissions, topic permissions, exchanges, queues and bindings, in that order
        (RabbitMQ's rabbit_definitions). Vhosts must be configured ones: a vhost the document
        names that ``braid serve`` has not is refused before anything changes."""
        known = set(self.security.vhosts)

        def items(key: str) -> list[Json]:
            value = body.get(key) or []
            if not isinstance(value, list) or not all(isinstance(i, dict) for i in value):
                raise bad_request(f"{key} must be a list of objects")
            if only is not None:
                value = [{**item, "vhost": only} for item in value]
            return value

        for key in ("permissions", "topic_permissions", "queues", "exchanges", "bindings"):
            for item in items(key):
                if item.get("vhost") not in known:
                    raise bad_request(
                        f"vhost {item.get('vhost')!r} of {key} is not configured "
                        f"(vhosts: {', '.join(sorted(known))})"
                    )
        for vhost_item in items("vhosts") if only is None else []:
            if vhost_item.get("name") not in known:
                raise bad_request(f"vhost {vhost_item.get('name')!r} is not configured")
        try:
            for user in items("users") if only is None else []:
                tags = user.get("tags", [])
                algorithm = str(user.get("hashing_algorithm") or "rabbit_password_hashing_sha256")
                await self.security.put_user(
                    str(user["name"]),
                    password_hash=PasswordHash(algorithm, str(user.get("password_hash", ""))),
                    tags=tags if isinstance(tags, list | str) else "",
                )
            for item in items("permissions"):
                await self.security.set_permission(
                    str(item["vhost"]), str(item["user"]), VhostPermission.from_json(item)
                )
            for item in items("topic_permissions"):
                await self.security.set_topic_permission(
                    str(item["vhost"]), str(item["user"]), TopicPermission.from_json(item)
                )
        except (KeyError, PasswordHashError) as error:
            raise bad_request(f"invalid definitions: {error}") from None
        except SecurityError as error:
            raise bad_request(str(error)) from None
        for item in items("exchanges"):
            await self._import_exchange(request, item)
        for item in items("queues"):
            await self._import_queue(request, item)
        for item in items("bindings"):
            vhost = str(item["vhost"])
            await self._bind(
                self.context(request, vhost),
                str(item["source"]),
                str(item.get("destination_type", "queue")),
                str(item["destination"]),
                str(item.get("routing_key", "")),
                dict(item.get("arguments") or {}),
                unbind=False,
            )
        log.info("management: %s imported definitions", request[REQUEST_USER])

    async def _import_exchange(self, request: web.Request, item: Json) -> None:
        context = self.context(request, str(item["vhost"]))
        await self.managed_change(
            self.api.manage_declare_exchange(
                context,
                str(item["name"]),
                str(item.get("type", "direct")),
                durable=bool(item.get("durable", True)),
                auto_delete=bool(item.get("auto_delete", False)),
                internal=bool(item.get("internal", False)),
                arguments=dict(item.get("arguments") or {}),
            )
        )

    async def _import_queue(self, request: web.Request, item: Json) -> None:
        context = self.context(request, str(item["vhost"]))
        await self.managed_change(
            self.api.manage_declare_queue(
                context,
                str(item["name"]),
                durable=bool(item.get("durable", True)),
                auto_delete=bool(item.get("auto_delete", False)),
                arguments=dict(item.get("arguments") or {}),
            )
        )
