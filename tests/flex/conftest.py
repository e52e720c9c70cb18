import pytest


@pytest.fixture
def sm90_fwd(monkeypatch):
    """Counts the flex Hopper forward's launches (a test that expects it on sm90 checks the count)."""
    from tileattn.ops.flex import launch_sm90
    calls = []
    real = launch_sm90.Sm90Backend.run
    monkeypatch.setattr(launch_sm90.Sm90Backend, "run", lambda *a: calls.append(1) or real(*a))
    return calls
