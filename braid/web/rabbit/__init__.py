"""The RabbitMQ management API's resources, with RabbitMQ 3.10's JSON shapes (issue 19 item 1):
what ``rabbitmqadmin``, the Terraform/Ansible modules and people's scripts call.

==========================================================  ===================================
``GET /api/overview``, ``/api/nodes[/{node}]``               the node, listeners, totals
``GET /api/exchanges[/{vhost}[/{name}]]``                    exchanges; PUT declares, DELETE
                                                             deletes (``?if-unused=true``)
``POST /api/exchanges/{vhost}/{name}/publish``               publish (``amq.default``: the
                                                             default exchange)
``GET /api/exchanges/{vhost}/{name}/bindings/source|destination``
``GET /api/queues[/{vhost}[/{name}]]``                       queues with messages,
                                                             messages_ready, _unacknowledged,
                                                             consumers, rates; PUT, DELETE
``DELETE /api/queues/{vhost}/{name}/contents``               purge
``POST /api/queues/{vhost}/{name}/get``                      browse (``ackmode``
                                                             ``ack_requeue_true`` keeps them)
``GET /api/queues/{vhost}/{name}/bindings``
``GET /api/bindings[/{vhost}]``; ``GET|POST /api/bindings/{vhost}/e/{src}/{q|e}/{dst}``;
``GET|DELETE .../{props}``                                   bindings
``GET /api/consumers[/{vhost}]``                             consumers of queues
``GET|POST /api/definitions``, ``/api/definitions/{vhost}``  export / import
``GET /api/health/checks/...``                               alarms, local-alarms,
                                                             port-listener, protocol-listener,
                                                             virtual-hosts, node-is-*-critical,
                                                             certificate-expiration
``GET /api/aliveness-test/{vhost}``                          declare, publish, get, in the vhost
==========================================================  ===================================

Who may do what, as RabbitMQ's ``rabbit_mgmt_util``: every management user reads the overview,
health checks and, for the vhosts it has a permission in, exchanges, queues, bindings and
Who may do what, as RabbitMQ's ``rabbit_mgmt_util``: every management user reads the overview,
health checks and, for the vhosts it has a permission in, exchanges, queues, bindings and
consumers (``monitoring`` and ``administrator``: every vhost; ``/api/nodes``: ``monitoring``);
declaring, deleting, purging, publishing and getting need access to the vhost; definitions need
``administrator``.

The AMQP objects are read from the core through the Broker API (``core/api/management.py``:
topics with their ``amqp`` config, ack queue counts, bindings) and changed through its
``manage_*`` calls, which the AMQP listener serves with its own virtual hosts
(``gateway/amqp/management.py``), so that a queue declared here is the queue AMQP clients see at
once, with the same equivalence checks and error texts.

Modules, one job each: :mod:`~braid.web.rabbit.common` (errors, names, sources),
:mod:`~braid.web.rabbit.shapes` (each object's JSON), :mod:`~braid.web.rabbit.base` (access,
listings), :mod:`~braid.web.rabbit.overview` (overview, nodes, health),
:mod:`~braid.web.rabbit.queues` (queues, consumers), :mod:`~braid.web.rabbit.exchanges`
(exchanges, publish, bindings), :mod:`~braid.web.rabbit.connections` (connections and
channels of every protocol), :mod:`~braid.web.rabbit.definitions`,
:mod:`~braid.web.rabbit.routes` (the handlers put together).
"""

from braid.web.rabbit.common import ManagementSources, node_name, rss_bytes
from braid.web.rabbit.routes import ROUTES, RabbitResources, rabbit_route

__all__ = [
    "ROUTES",
    "ManagementSources",
    "RabbitResources",
    "node_name",
    "rabbit_route",
    "rss_bytes",
]
