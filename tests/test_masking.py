"""Secrets masked by key, inside values and by value (stateful_runtime.masking), and the
``--set`` overrides that travel to child processes through the environment."""

from __future__ import annotations

import json

import pytest

from stateful_runtime import masking


@pytest.mark.parametrize(
    "key",
    [
        "kafka.sasl.password",
        "sasl.password",
        "sink.password",
        "ssl.key.password",
        "ssl.key.pem",
        "ssl.keystore.password",
        "sasl.oauthbearer.client.secret",
        "sasl.jaas.config",
        "access_key",
        "secret_key",
        "api_key",
        "apiKey",
        "aws_secret_access_key",
        "s3.accessKey",
        "AWS_SESSION_TOKEN",
        "credentials",
        "private_key",
        "oauth.token",
        "db.passwd",
    ],
)
def test_secret_keys(key):
    assert masking.is_secret_key(key)


@pytest.mark.parametrize(
    "key",
    [
        "sasl.mechanism",
        "sasl.username",
        "kafka.sasl.mechanism",
        "sink.key",
        "key",
        "sink.dsn",
        "sink.url",
        "token_file",
        "ssl.key.location",
        "checkpoint.dir",
        "source.topic",
        "sink.table",
        "keyed_by",
        "monkey",
    ],
)
def test_plain_keys(key):
    assert not masking.is_secret_key(key)


def test_config_masked_by_key_and_inside_urls_env_references_kept():
    config = {
        "kafka.sasl.password": "k4fka-pw",
        "sink.password": "env:PGPASSWORD",
        "sink.dsn": "postgresql://srt:pg-s3cret@127.0.0.1:5432/db",
        "sink.url": "clickhouse://default:ch-s3cret@127.0.0.1:9000/default",
        "source.topic": "upi-payments",
    }
    shown = masking.mask_config(config)
    assert shown == {
        "kafka.sasl.password": "***",
        "sink.password": "env:PGPASSWORD",
        "sink.dsn": "postgresql://srt:***@127.0.0.1:5432/db",
        "sink.url": "clickhouse://default:***@127.0.0.1:9000/default",
        "source.topic": "upi-payments",
    }
    # Seen once, each value is masked wherever it appears later, in any text.
    text = "connect failed for k4fka-pw; retry pg-s3cret then ch-s3cret http://host:8080/path@x"
    assert masking.mask_text(text) == (
        "connect failed for ***; retry *** then *** http://host:8080/path@x"
    )


def test_text_masks_urls_and_secret_pairs_never_seen_before():
    line = (
        "srt run job.py --set kafka.sasl.password=n3ver-seen-1 --set sink.table=t "
        "--set sink.dsn=postgresql://u:n3ver-seen-2@h/db host=h password='n3ver-seen-3' "
        '{"api_key": "n3ver-seen-4", "rows": 3}'
    )
    masked = masking.mask_text(line)
    for n in range(1, 5):
        assert f"n3ver-seen-{n}" not in masked
    assert "sink.table=t" in masked and '"rows": 3' in masked
    # ... and, once masked in one text, by value in the next.
    assert masking.mask_text("it was n3ver-seen-1") == "it was ***"


def test_mask_data_walks_json():
    data = {
        "config": {"aws_secret_access_key": "AKIAsecretvalue"},
        "command": ["srt", "--set", "access_key=AKIAother99"],
        "message": "failed: postgresql://u:abc12345@h/d",
    }
    out = json.dumps(masking.mask_data(data))
    assert "AKIAsecretvalue" not in out and "AKIAother99" not in out and "abc12345" not in out


def test_overrides_with_secrets_travel_in_the_environment():
    config = {
        "kafka.sasl.password": "pw-123456",
        "sink.password": "env:PW",
        "sink.dsn": "postgresql://u:dsn-123456@h/d",
        "parallelism": 2,
    }
    public, hidden = masking.split_overrides(config)
    assert public == {"sink.password": "env:PW", "parallelism": 2}
    assert hidden == {
        "kafka.sasl.password": "pw-123456",
        "sink.dsn": "postgresql://u:dsn-123456@h/d",
    }
    env = {"OTHER": "1", **masking.child_env(hidden)}
    assert masking.take_env_overrides(env) == hidden
    assert env == {"OTHER": "1"}  # removed: Spark's processes do not inherit it
    assert masking.take_env_overrides({}) == {}


def test_masking_stream():
    import io

    buf = io.StringIO()
    stream = masking.MaskingStream(buf)
    masking.remember("streamed-secret")
    print("a streamed-secret b", file=stream)
    assert buf.getvalue() == "a *** b\n"


def test_a_short_secret_is_masked_where_it_stands_alone_a_long_one_everywhere():
    masking.remember("0000")
    masking.remember("n3ver-seen-long")
    path = "/savepoints/upi-per-minute-20261202T000047-ad6b"
    assert masking.mask_text(path) == path  # a timestamp, not the PIN
    assert masking.mask_text("pin 0000, again:0000.") == "pin ***, again:***."
    assert masking.mask_text("x-n3ver-seen-longer") == "x-***er"
