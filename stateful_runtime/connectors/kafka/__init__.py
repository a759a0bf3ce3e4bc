"""Kafka on confluent-kafka: client settings and commit markers (``client``), the source
(``source``), the exactly-once transactional sink (``sink``) and dead letters
(``dead_letters``)."""
