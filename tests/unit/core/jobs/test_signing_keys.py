"""Signing keys as a keyring (``core.jobs.signing``, ``hooks.signing``): the newest seals
and signs, every key verifies, and a seal made with a key that left the ring fails
naming that key, never looking like a forgery a retry would ignore."""

from __future__ import annotations

import hashlib
import hmac
import json
import pickle

import pytest

from airflow_provider_kinetic.core.jobs.signing import (
    Keyring,
    ResultAuthError,
    ResultKey,
    SigningKeyChanged,
    decrypt_env,
    encrypt_env,
    job_key,
    key_id,
    seal,
    sign,
    unseal,
    verify,
)

OLD, NEW = b"o" * 32, b"n" * 32
RECORD = {"kind": "job", "handle": {"job_id": "job-00000001"}}


def test_the_newest_seals_and_every_key_of_the_ring_verifies():
    sealed_old = seal(Keyring([OLD]), RECORD)
    assert json.loads(sealed_old)["kid"] == key_id(OLD)
    assert unseal(Keyring([NEW, OLD]), sealed_old, "rec") == RECORD
    sealed_new = seal(Keyring([NEW, OLD]), RECORD)
    assert json.loads(sealed_new)["kid"] == key_id(NEW)
    assert unseal(Keyring([NEW]), sealed_new, "rec") == RECORD
    assert unseal(NEW, sealed_new, "rec") == RECORD  # a plain secret is a ring of one
    with pytest.raises(SigningKeyChanged) as info:
        unseal(Keyring([NEW]), sealed_old, "the record r")
    text = str(info.value)
    assert f"the record r was sealed with signing key {key_id(OLD)}" in text
    assert "the signing key changed" in text and key_id(NEW) in text
    assert "result_signing_keys" in text


def test_seals_from_before_key_ids_verify_under_any_key_of_the_ring():
    body = json.dumps(RECORD, sort_keys=True, separators=(",", ":"))
    mac = hmac.new(OLD, b"kinetic-record:" + body.encode(), hashlib.sha256).hexdigest()
    legacy = json.dumps({"record": RECORD, "mac": mac}).encode()
    assert unseal(Keyring([NEW, OLD]), legacy, "rec") == RECORD
    with pytest.raises(ResultAuthError, match="does not match its seal") as info:
        unseal(Keyring([NEW]), legacy, "rec")
    assert not isinstance(info.value, SigningKeyChanged)  # no key id to name


def test_result_keys_across_a_rotation():
    blob = b"result bytes"
    signature = sign(job_key(OLD, "job-1"), blob)
    # The handle says which key the job got: it is found in the ring, or named.
    verify(ResultKey.for_job(Keyring([NEW, OLD]), "job-1", key_id(OLD)), blob, signature, "r")
    with pytest.raises(SigningKeyChanged, match=f"sealed with signing key {key_id(OLD)}"):
        verify(ResultKey.for_job(Keyring([NEW]), "job-1", key_id(OLD)), blob, signature, "r")
    # No key id (a handle from before them, a batch child): any key of the ring.
    verify(ResultKey.for_job(Keyring([NEW, OLD]), "job-1"), blob, signature, "r")
    with pytest.raises(ResultAuthError, match=f"checked with signing keys {key_id(NEW)}"):
        verify(ResultKey.for_job(Keyring([NEW]), "job-1"), blob, signature, "r")
    # Never another job's key, whatever the ring holds.
    with pytest.raises(ResultAuthError, match="does not match its signature"):
        verify(ResultKey.for_job(Keyring([NEW, OLD]), "job-2", key_id(OLD)), blob, signature, "r")
    # As a str it is the job's key under the newest secret (what a new job receives).
    assert ResultKey.for_job(Keyring([NEW, OLD]), "job-1") == job_key(NEW, "job-1")
    assert job_key(Keyring([NEW, OLD]), "job-1") == job_key(NEW, "job-1")


def test_keys_survive_a_pickle_round_trip():
    ring = pickle.loads(pickle.dumps(Keyring([NEW, OLD])))
    assert ring.secrets == (NEW, OLD) and bytes(ring) == NEW
    key = pickle.loads(pickle.dumps(ResultKey.for_job(ring, "job-1", key_id(OLD))))
    assert key.sealed_by == key_id(OLD) and key.candidates[key_id(OLD)] == job_key(OLD, "job-1")


def test_a_keyring_never_shows_a_secret():
    ring = Keyring([NEW, OLD])
    assert repr(ring) == f"Keyring({key_id(NEW)}, {key_id(OLD)})"
    key = ResultKey.for_job(ring, "job-1", key_id(NEW))
    assert job_key(NEW, "job-1") not in repr(key) and key_id(NEW) in repr(key)
    assert len(key_id(NEW)) == 8 and key_id(NEW) != key_id(OLD)


def test_sealed_env_survives_a_rotation():
    token = encrypt_env(Keyring([OLD]), {"TOKEN": "v"})
    assert decrypt_env(Keyring([NEW, OLD]), token) == {"TOKEN": "v"}


def test_the_ring_comes_from_the_config_and_lists_the_single_key_by_its_text(monkeypatch):
    """``result_signing_keys = <new>, <old result_signing_key>`` rotates away from the
    single key: the old text gives the same secret in either option."""
    from airflow_provider_kinetic.deployment.signing import deployment_secret

    monkeypatch.setenv("AIRFLOW__KINETIC__RESULT_SIGNING_KEY", "old-text")
    monkeypatch.delenv("AIRFLOW__KINETIC__RESULT_SIGNING_KEYS", raising=False)
    single = deployment_secret()
    assert len(single.secrets) == 1
    monkeypatch.setenv("AIRFLOW__KINETIC__RESULT_SIGNING_KEYS", " new-text ,\nold-text ")
    ring = deployment_secret()
    assert ring.secrets[1] == bytes(single) and bytes(ring) == ring.secrets[0] != bytes(single)
    monkeypatch.setenv("AIRFLOW__KINETIC__RESULT_SIGNING_KEYS", "new-text")
    assert deployment_secret().secrets == (ring.secrets[0],)


def test_a_tampered_key_id_is_reported_as_tampering_not_as_a_rotation():
    sealed = json.loads(seal(Keyring([NEW]), RECORD))
    # The key id swapped for another well-formed one, the seal still under our key:
    # the ring's own key verifies it, so the id was altered (not a key that left).
    swapped = json.dumps({**sealed, "kid": key_id(OLD)}).encode()
    with pytest.raises(ResultAuthError, match="its key id was altered") as info:
        unseal(Keyring([NEW]), swapped, "rec")
    assert not isinstance(info.value, SigningKeyChanged)
    assert "result_signing_keys" not in str(info.value)  # no advice to add a key
    # Something that is no key id at all, on a seal no key of ours makes.
    foreign = json.loads(seal(Keyring([OLD]), RECORD))
    for bad in ("../../etc", 12345678, "ABCDEFGH"):
        junk = json.dumps({**foreign, "kid": bad}).encode()
        with pytest.raises(ResultAuthError, match="which is not a key id: it was altered") as info:
            unseal(Keyring([NEW]), junk, "rec")
        assert not isinstance(info.value, SigningKeyChanged)
    # A well-formed unknown id with a seal no key of ours makes: the message says
    # both what it may be and not to add a key for a deployment that never had it.
    with pytest.raises(SigningKeyChanged, match="the record was altered: do not add a key"):
        unseal(Keyring([NEW]), seal(Keyring([OLD]), RECORD), "rec")


def test_a_handle_naming_another_key_for_a_result_our_key_signed_is_altered():
    blob = b"result bytes"
    signature = sign(job_key(NEW, "job-1"), blob)
    with pytest.raises(ResultAuthError, match="its key id was altered") as info:
        verify(ResultKey.for_job(Keyring([NEW]), "job-1", key_id(OLD)), blob, signature, "r")
    assert not isinstance(info.value, SigningKeyChanged)
