"""Example Spark jobs over a BraidMQ log, each runnable with one command::

    python -m spark.jobs.traffic DATA_DIR OUT_DIR        # per protocol, topic, minute + PNG
    python -m spark.jobs.deadletters DATA_DIR OUT_DIR    # dead letters by reason and origin
    python -m spark.jobs.crossprotocol DATA_DIR OUT_DIR  # one key across Kafka, AMQP, MQTT

or with ``spark-submit --master spark://... -m``-style ``spark-submit spark/jobs/traffic.py``.
Each module also has ``run(session, data_dir, out_dir)`` for use from other code and tests.
"""
