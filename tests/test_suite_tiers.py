"""The suite's tiers as docs/pipeline.md ("Tests") states them."""


def test_no_test_of_the_unit_tier_uses_the_suites_prefect_server(request):
    """Every test collected with this one that uses the suite's server (`server`, directly or through `worker` or
    `prefect_server`) is in the end-to-end tier, so `-m "not slow"` never starts a server: one unmarked test made
    the unit tier pay a whole server's start (about 20 CPU-seconds)."""
    unmarked = [item.nodeid for item in request.session.items
                if "server" in getattr(item, "fixturenames", ()) and "slow" not in item.keywords]
    assert not unmarked, f"on the suite's server but in the unit tier: {unmarked}"
