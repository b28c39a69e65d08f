from __future__ import annotations



import tasks  # noqa: F401  (importing the app applies the patch)




def test_an_open_transport_still_builds_its_parameters():
    from kombu import Connection

    with Connection("redis://127.0.0.1:6379/9") as conn:
        params = conn.default_channel._connparams()
    assert params["host"] == "127.0.0.1" and params["port"] == 6379
