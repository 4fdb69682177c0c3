"""The key rule, ``key@version`` refs and the nearest-key hint (``core/keys/names.py``),
and a key's history as stored (``core/keys/records.py``)."""

from __future__ import annotations

import pytest

from airflow_provider_kinetic.core.keys.keystore import parse_ttl
from airflow_provider_kinetic.core.keys.names import (
    KeyNameError,
    check_prefix,
    key_of_pointer,
    nearest,
    parse_ref,
    pointer_key,
)
from airflow_provider_kinetic.core.keys.records import KeyState, Version

HASH = "ab" * 32


@pytest.mark.parametrize("key", ["models/churn", "a", "A-b_c.d/e.f/0", "x/y/z.safetensors"])
def test_good_keys_round_trip_through_their_pointer(key: str) -> None:
    assert parse_ref(key) == (key, None)
    assert key_of_pointer(pointer_key(key)) == key


def test_refs_pin_versions_and_must_agree() -> None:
    assert parse_ref(f"m/c@{HASH}") == ("m/c", HASH)
    assert parse_ref("m/c", HASH[:8]) == ("m/c", HASH[:8])
    with pytest.raises(KeyNameError, match="pins version"):
        parse_ref(f"m/c@{HASH}", "cafe00")
    with pytest.raises(KeyNameError, match="'@' outside a version"):
        parse_ref("m/c@latest")
    with pytest.raises(KeyNameError, match="6 to 64 lowercase hex"):
        parse_ref("m/c", "ABCDEF")


def test_prefixes_and_the_nearest_key_hint() -> None:
    assert check_prefix("") == "" and check_prefix("models/") == "models/"
    with pytest.raises(KeyNameError, match="'..' segment"):
        check_prefix("../")
    assert nearest("models/chrun", ["models/churn", "data/x"]) == "nearest keys: models/churn"
    assert nearest("a", []) == "the store holds no key"
    assert parse_ttl("7d") == 7 * 86400 and parse_ttl(30) == 30.0 and parse_ttl(None) is None
    for bad in ("0s", "-1", "soon", 0):
        with pytest.raises(KeyNameError, match="a duration such as"):
            parse_ttl(bad)


def test_history_keeps_the_newest_and_one_entry_per_hash() -> None:
    def v(h: str, t: float) -> Version:
        return Version(h * 64, t, 1, 1, "dir")

    state = KeyState("k", keep=2)
    for h, t in (("a", 1), ("b", 2), ("a", 3), ("c", 4)):
        state = state.pushed(v(h, t))
    assert [(x.version[0], x.epoch) for x in state.versions] == [("c", 4), ("a", 3)]
    again = KeyState.from_bytes(state.to_bytes())
    assert again == state and again.current.version == "c" * 64
    state.ttl_s = 10
    assert state.expires_at == 14 and state.expired(14) and not state.expired(13.9)


def test_an_over_long_key_fails_before_anything_is_uploaded(tmp_path) -> None:
    from airflow_provider_kinetic.core.keys.keystore import KeyStore
    from airflow_provider_kinetic.core.storage.local import LocalStore

    root = tmp_path / "store"
    root.mkdir()
    src = tmp_path / "model.bin"
    src.write_bytes(b"weights")
    keys = KeyStore(LocalStore(str(root)))
    for key, says in (("k" * 2000, "2000 characters long"), ("m/" + "s" * 300, "300 characters")):
        with pytest.raises(KeyNameError, match=says) as info:
            keys.put(key, src)
        assert "at most 512 characters" in str(info.value)
    # Nothing moved: no data-cache entry, no key, no temp file.
    assert [p for p in root.rglob("*") if p.is_file()] == []
    assert keys.put("m/" + "s" * 200, src)  # the caps themselves are allowed
