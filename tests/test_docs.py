from gen.docs import stale


def test_generated_docs_are_fresh():
    assert stale() == [], "generated docs are stale: run `python -m gen.docs`"
