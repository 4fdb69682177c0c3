"""BroadcastWindow: a bad window fails where it is made, naming the value and the range."""

from __future__ import annotations

import pytest

from airflow_provider_kinetic import BroadcastWindow
from airflow_provider_kinetic.core.keys.peer.window import BroadcastWindowError


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"fanout": 0}, ["fanout=0", ">= 1"]),
        ({"fanout": True}, ["fanout=True", ">= 1"]),
        ({"world_size": 0}, ["world_size=0", ">= 1"]),
        ({"world_size": -3}, ["world_size=-3", ">= 1"]),
        ({"timeout": "soon"}, ["timeout='soon'", "'30s'"]),
        ({"timeout": 0}, ["timeout=0", "> 0"]),
        ({"group_id": ""}, ["group_id=''", "non-empty"]),
    ],
)
def test_a_bad_window_names_the_value_and_the_allowed_form(kwargs, names) -> None:
    with pytest.raises(BroadcastWindowError) as err:
        BroadcastWindow(**kwargs)
    for part in names:
        assert part in str(err.value)
    assert isinstance(err.value, ValueError)


def test_timeouts_are_normalised_to_seconds_and_round_trip() -> None:
    w = BroadcastWindow(fanout=3, timeout="2m", world_size=4, group_id="g")
    assert w.timeout_s == 120.0
    assert BroadcastWindow.from_dict(w.to_dict()) == w
    assert BroadcastWindow().fanout == 50 and BroadcastWindow().world_size is None
