"""Bundles: a peer's small files in one response, on a real peer server on loopback.

What a getter must be able to rely on: every file of a bundle arrives whole and
checked (an empty one too), in the order asked; a parent still receiving stops a
bundle at the first file it does not have and the getter asks again from there;
big files still go one per request; a request without the token, or a body that is
not a list of paths, gets nothing.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.keys.peer import bundle as peerbundle
from airflow_provider_kinetic.core.keys.peer import errors as peererrors
from airflow_provider_kinetic.core.keys.peer import fetch as peerfetch
from airflow_provider_kinetic.core.keys.peer import protocol
from airflow_provider_kinetic.core.keys.peer import receiving as peerreceiving
from airflow_provider_kinetic.core.keys.peer import serve as peerserve
from airflow_provider_kinetic.core.keys.peer.registry import COMPLETE, RECEIVING, peer_token
from tests.fixtures.waiting import wait_for

TOKEN = peer_token(b"deployment-secret", "bundles-test")


def _files(src: Path, sizes: list[int]) -> list[list[object]]:
    src.mkdir(parents=True, exist_ok=True)
    listed = []
    for i, size in enumerate(sizes):
        rel = f"d{i % 3}/f{i:03d}.bin"
        (src / rel).parent.mkdir(exist_ok=True)
        (src / rel).write_bytes(os.urandom(size))
        listed.append([rel, size])
    return listed


def _server(src: Path, listed: list[list[object]], ready: int, state: str = COMPLETE):
    server = peerserve.PeerServer(TOKEN)
    expected = [(str(r), int(str(n))) for r, n in listed]
    files = {str(r): (str(src / str(r)), "") for r, _ in listed[:ready]}
    server.add(peerserve.Root("v1", "dir", "", expected, state=state, ready=files))
    return server


def test_plan_keeps_order_and_sends_big_files_alone() -> None:
    small, big = peerbundle.BUNDLE_FILE_MAX, peerbundle.BUNDLE_FILE_MAX + 1
    files = [[f"f{i}", small if i != 70 else big] for i in range(140)]
    bundles, singles = peerbundle.plan(files)
    assert singles == [["f70", big]]
    assert [e for b in bundles for e in b] == [f for f in files if f[1] == small]
    assert all(sum(int(e[1]) for e in b) <= peerbundle.BUNDLE_BYTES for b in bundles)
    assert all(len(b) <= peerbundle.BUNDLE_FILES for b in bundles)


def test_a_bundle_from_a_parent_still_receiving_resumes_where_it_stopped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = tmp_path / "src"
    listed = _files(src, [0, 1, 70_000, 5_000, 123_456, 9, 64_000, 1_000])
    server = _server(src, listed, ready=3, state=RECEIVING)
    base, digests, told = tmp_path / "copy", peerreceiving.tree_digests(), []
    base.mkdir()
    got: list[int] = []
    try:
        thread = threading.Thread(
            target=lambda: got.append(
                peerfetch.pull_peer(
                    server.address,
                    "v1",
                    TOKEN,
                    str(base),
                    listed,
                    lambda rel, _p, _d: told.append(rel),
                    30.0,
                    None,
                    digests,
                )  # fmt: skip
            )
        )
        thread.start()
        # The first three arrive; the bundle is held at the fourth, then stops.
        wait_for("the first files", lambda: len(told) == 3, 20)
        for rel, _ in listed[3:]:
            server.file_ready("v1", str(rel), str(src / str(rel)), "")
        server.set_state("v1", COMPLETE)
        thread.join(30)
    finally:
        server.close()
    assert got == [sum(int(str(n)) for _, n in listed)]
    assert told == [rel for rel, _ in listed]  # in the order asked
    for rel, _ in listed:
        assert (base / str(rel)).read_bytes() == (src / str(rel)).read_bytes()
    assert not [p for p in base.rglob("*.kinetic-part")]


def test_a_bundle_whose_file_is_not_the_listed_size_is_not_kept(tmp_path: Path) -> None:
    src = tmp_path / "src"
    listed = _files(src, [10, 20, 30])
    server = _server(src, listed, ready=3)
    wrong = [list(e) for e in listed]
    wrong[1][1] = 21  # the getter's list says 21 bytes: the parent sends 20
    base = tmp_path / "copy"
    base.mkdir()
    try:
        with pytest.raises(peererrors.PeerUnavailable, match=r"where d1/f001.bin \(21 bytes\)"):
            peerfetch.pull_peer(server.address, "v1", TOKEN, str(base), wrong,
                                lambda *_: None, 5.0)  # fmt: skip
    finally:
        server.close()
    assert sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file()) == [
        "d0/f000.bin"
    ]


@pytest.mark.parametrize(
    ("token", "body", "status"),
    [
        (None, b'{"files": ["d0/f000.bin"]}', 403),
        (peer_token(b"other-deployment", "bundles-test"), b'{"files": ["d0/f000.bin"]}', 403),
        (TOKEN, b'{"files": "d0/f000.bin"}', 400),
        (TOKEN, b"not json", 400),
    ],
)
def test_a_bundle_request_without_the_token_or_a_list_gets_nothing(
    tmp_path: Path, token: str | None, body: bytes, status: int
) -> None:
    src = tmp_path / "src"
    listed = _files(src, [10])
    server = _server(src, listed, ready=1)
    host, port = server.address.split(":")
    try:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        headers = {} if token is None else {protocol.TOKEN_HEADER: token}
        conn.request("POST", "/v/v1/bundle", body=body, headers=headers)
        resp = conn.getresponse()
        answer = resp.read()
        conn.close()
    finally:
        server.close()
    assert resp.status == status
    assert (src / "d0/f000.bin").read_bytes() not in answer
    if status == 400:
        assert b"bundle" in answer or b"Expecting" in answer or b"json" in answer.lower()


def test_a_bundle_streams_every_frame_with_its_digest(tmp_path: Path) -> None:
    src = tmp_path / "src"
    listed = _files(src, [0, 33, 4096])
    server = _server(src, listed, ready=3)
    host, port = server.address.split(":")
    try:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        body = json.dumps({"files": [r for r, _ in listed]}).encode()
        conn.request("POST", "/v/v1/bundle", body=body, headers={protocol.TOKEN_HEADER: TOKEN})
        resp = conn.getresponse()
        frames = []
        while "stop" not in (head := peerbundle.read_header(resp)):
            frames.append((head, resp.read(head["size"])))
        conn.close()
    finally:
        server.close()
    assert head == {"stop": "end"}  # said, not just a connection that ended
    assert [(h["rel"], h["size"]) for h, _ in frames] == [tuple(e) for e in listed]
    for head, data in frames:
        assert data == (src / head["rel"]).read_bytes()
        assert head["digest"] == protocol.file_digest(head["rel"], str(src / head["rel"]))
