"""``/api/overview``, ``/api/nodes[/{node}]``, ``/api/health/checks/*`` and
``/api/aliveness-test/{vhost}``: the node as RabbitMQ 3.10 describes one."""

from __future__ import annotations

import os
import platform
import resource
import shutil
import time

from aiohttp import web

from braid.web.rabbit.base import ResourceBase
from braid.web.rabbit.common import (
    ALIVENESS_QUEUE,
    PRODUCT_NAME,
    RABBIT_COMPAT_VERSION,
    Json,
    braid_version,
    json_response,
    node_name,
    not_found,
    rate,
    rss_bytes,
    topic_of,
)
from braid.web.rabbit.shapes import exchange_types_json
from core.security.model import TAG_MONITORING
from gateway.amqp.vhost import QUEUE_TOPIC_PREFIX


class OverviewResources(ResourceBase):
    async def overview(self, request: web.Request, _segments: list[str]) -> web.StreamResponse:
        context = self.context(request)
        vhosts = self.visible_vhosts(request)
        queues = self.queues_of(context, vhosts)
        consumers = self.api.all_consumers(context)
        connections = self.api.list_connections(context)
        ready = sum(q["messages_ready"] for q in queues)
        unacked = sum(q["messages_unacknowledged"] for q in queues)
        http = [listener for listener in self.listeners_json() if "http" in listener["protocol"]]
        return json_response(
            {
                "management_version": RABBIT_COMPAT_VERSION,
                "release_series_support_status": "supported",
                "rates_mode": "basic",
                "exchange_types": exchange_types_json(),
                "product_version": braid_version(),
                "product_name": PRODUCT_NAME,
                "rabbitmq_version": RABBIT_COMPAT_VERSION,
                "cluster_name": node_name(),
                "erlang_version": platform.python_version(),
                "erlang_full_version": f"Python {platform.python_version()}",
                "disable_stats": False,
                "enable_queue_totals": False,
                "message_stats": {},
                "churn_rates": {},
                "queue_totals": {
                    "messages": ready + unacked,
                    "messages_details": rate(0.0),
                    "messages_ready": ready,
                    "messages_ready_details": rate(0.0),
                    "messages_unacknowledged": unacked,
                    "messages_unacknowledged_details": rate(0.0),
                },
                "object_totals": {
                    "channels": sum(len(c.channels) for c in connections),
                    "connections": len(connections),
                    "consumers": len(consumers),
                    "exchanges": len(self.exchanges_of(context, vhosts)),
                    "queues": len(queues),
                },
                "statistics_db_event_queue": 0,
                "node": node_name(),
                "listeners": self.listeners_json(),
                "contexts": [
                    {
                        "node": node_name(),
                        "description": "RabbitMQ Management",
                        "path": "/",
                        "port": str(listener["port"]),
                        "ip": listener["ip_address"],
                        "ssl_opts": [],
                        "cowboy_opts": "[{sendfile,false}]",
                    }
                    for listener in http
                ],
            }
        )

    def node_json(self) -> Json:
        uptime_ms = int((time.monotonic() - self.sources.started_monotonic) * 1000)
        disk = shutil.disk_usage(".")
        rss = rss_bytes()
        try:
            fd_used = len(os.listdir("/proc/self/fd"))
        except OSError:
            fd_used = 0
        fd_total = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return {
            "name": node_name(),
            "type": "disc",
            "running": True,
            "being_drained": False,
            "uptime": uptime_ms,
            "os_pid": str(os.getpid()),
            "processors": os.cpu_count() or 1,
            "run_queue": 0,
            "mem_used": rss,
            "mem_limit": 0,
            "mem_alarm": False,
            "disk_free": disk.free,
            "disk_free_limit": 0,
            "disk_free_alarm": False,
            "fd_used": fd_used,
            "fd_total": fd_total,
            "sockets_used": self.sources.connection_count(),
            "sockets_total": fd_total,
            "proc_used": 1,
            "proc_total": 1,
            "partitions": [],
            "applications": [],
            "exchange_types": exchange_types_json(),
            "rates_mode": "basic",
            "net_ticktime": 60,
            "enabled_plugins": ["rabbitmq_management"],
        }

    async def nodes(self, request: web.Request, segments: list[str]) -> web.StreamResponse:
        self._require(request, TAG_MONITORING)
        if len(segments) == 1:
            return json_response([self.node_json()])
        if segments[1] != node_name():
            raise not_found()
        return json_response(self.node_json())

    # -- health ----------------------------------------------------------------------------

    async def health(self, request: web.Request, segments: list[str]) -> web.StreamResponse:
        self._allow(request, {"GET"})
        if len(segments) < 3 or segments[1] != "checks":
            raise not_found()
        check, arguments = segments[2], segments[3:]
        if check in ("alarms", "local-alarms"):
            reason = self.api.publishing_blocked_reason()
            if reason:
                return json_response(
                    {
                        "status": "failed",
                        "reason": f"resource alarm in effect: {reason}",
                        "alarms": [{"node": node_name(), "resource": reason}],
                    },
                    503,
                )
            return json_response({"status": "ok"})
        if check == "port-listener" and len(arguments) == 1:
            ports = {listener["port"] for listener in self.listeners_json()}
            if arguments[0].isdigit() and int(arguments[0]) in ports:
                return json_response({"status": "ok", "port": int(arguments[0])})
            return json_response(
                {
                    "status": "failed",
                    "reason": f"No active listener on port {arguments[0]}",
                    "missing": arguments[0],
                    "ports": sorted(ports),
                },
                503,
            )
        if check == "protocol-listener" and len(arguments) == 1:
            protocols = {listener["protocol"] for listener in self.listeners_json()}
            wanted = arguments[0].lower()
            if wanted in protocols:
                return json_response({"status": "ok", "protocols": sorted(protocols)})
            return json_response(
                {
                    "status": "failed",
                    "reason": f"No active listener for protocol {arguments[0]}",
                    "missing": arguments[0],
                    "protocols": sorted(protocols),
                },
                503,
            )
        if check == "virtual-hosts" and not arguments:
            return json_response({"status": "ok"})
        if check in ("node-is-quorum-critical", "node-is-mirror-sync-critical") and not arguments:
            return json_response({"status": "ok"})  # one node: nothing depends on it elsewhere
        if check == "certificate-expiration" and len(arguments) == 2:
            return json_response({"status": "ok"})
        raise not_found()

    async def aliveness(self, request: web.Request, segments: list[str]) -> web.StreamResponse:
        self._allow(request, {"GET"})
        if len(segments) != 2:
            raise not_found()
        vhost = segments[1]
        self._check_vhost(request, vhost)
        context = self.context(request, vhost)
        await self.managed_change(
            self.api.manage_declare_queue(
                context, ALIVENESS_QUEUE, durable=False, auto_delete=False, arguments={}
            )
        )
        topic = topic_of(vhost, QUEUE_TOPIC_PREFIX + ALIVENESS_QUEUE)
        await self.api.purge_queue(context, topic)
        await self.api.publish(
            context, topic, b"test_message", subject=ALIVENESS_QUEUE, create_topic=False
        )
        got = await self.api.browse_queue(context, topic, 1, requeue=False) or []
        if not got or got[0].body != b"test_message":
            return json_response({"status": "failed", "reason": "no message came back"}, 503)
        return json_response({"status": "ok"})
