"""kombu against a real ``braid serve``: a Celery-style task round trip (a task message on a
direct exchange, a worker that acks it and publishes the result to the caller's reply queue)."""

from __future__ import annotations

import uuid
from typing import Any

from kombu import Connection, Consumer, Exchange, Producer, Queue

from tests.amqp.conftest import unique
from tests.braid_process import BraidProcess


def test_celery_style_task_round_trip(braid: BraidProcess) -> None:
    tasks = Exchange(unique("celery"), type="direct", durable=True)
    task_queue = Queue(unique("celery"), tasks, routing_key="celery", durable=True)
    results = Queue(unique("results"), exclusive=True, auto_delete=True)
    with Connection(braid.amqp_url) as caller, Connection(braid.amqp_url) as worker_conn:
        # The caller declares its result queue and sends three tasks.
        caller_channel = caller.channel()
        results = results(caller_channel)
        results.declare()
        producer = Producer(caller_channel, exchange=tasks, serializer="json")
        ids = []
        for a, b in ((2, 3), (10, 20), (-1, 1)):
            task_id = str(uuid.uuid4())
            ids.append(task_id)
            producer.publish(
                {"task": "add", "id": task_id, "args": [a, b], "kwargs": {}},
                routing_key="celery",
                declare=[task_queue],
                reply_to=results.name,
                correlation_id=task_id,
                headers={"task": "add", "id": task_id},
                delivery_mode=2,
            )

        # The worker consumes with manual acks (prefetch 1, as a Celery worker with
        # worker_prefetch_multiplier=1) and replies through the default exchange.
        worker_channel = worker_conn.channel()
        reply_producer = Producer(worker_channel, serializer="json")
        done: list[str] = []

        def run_task(body: dict[str, Any], message: Any) -> None:
            assert message.headers["task"] == "add"
            reply_producer.publish(
                {"status": "SUCCESS", "result": sum(body["args"]), "task_id": body["id"]},
                exchange="",
                routing_key=message.properties["reply_to"],
                correlation_id=message.properties["correlation_id"],
            )
            message.ack()
            done.append(body["id"])

        with Consumer(worker_channel, [task_queue], callbacks=[run_task], prefetch_count=1):
            while len(done) < 3:
                worker_conn.drain_events(timeout=10)
        assert done == ids

        replies: dict[str, Any] = {}

        def on_result(body: dict[str, Any], message: Any) -> None:
            replies[message.properties["correlation_id"]] = body["result"]
            message.ack()

        with Consumer(caller_channel, [results], callbacks=[on_result]):
            while len(replies) < 3:
                try:
                    caller.drain_events(timeout=10)
                except TimeoutError:
                    break
        assert replies == {ids[0]: 5, ids[1]: 30, ids[2]: 0}
        task_queue(caller_channel).delete()
