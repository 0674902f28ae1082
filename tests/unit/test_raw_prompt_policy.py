"""`raw_prompt_special_tokens`: a rule's switch, carried by its Decision to the engine request
(whether control tokens spelled in a raw prompt are parsed), true by default."""

from __future__ import annotations

import pytest

from policies import Judge, Principal, RequestFacts, decide, load_default_policy, loads_policy

POLICY = """
name = "raw"

[[rules]]
name = "plain"
teams = ["plain"]
models = ["*"]
raw_prompt_special_tokens = false

[[rules]]
name = "denied-but-plain"
teams = ["denied"]
models = []
raw_prompt_special_tokens = false

[[rules]]
name = "apps"
models = ["*"]
"""


def _who(team: str) -> Principal:
    return Principal("k1", team, frozenset({"app"}), None)


def _facts() -> RequestFacts:
    return RequestFacts(
        model="gemma",
        engine_classes=frozenset({"edge"}),
        max_tokens=16,
        n=1,
        prompt_bytes=10,
        stream=False,
        action="completions",
    )


@pytest.mark.parametrize(
    ("team", "allowed", "parse"),
    [("plain", True, False), ("denied", False, False), ("other", True, True)],
)
def test_the_deciding_rule_sets_the_switch(team: str, allowed: bool, parse: bool) -> None:
    policy = loads_policy(POLICY)
    for decision in (
        decide(policy, _who(team), _facts()),
        Judge(policy).decide(_who(team), _facts()),
    ):
        assert decision.allowed is allowed
        assert decision.raw_prompt_special_tokens is parse


def test_the_default_policy_keeps_parsing_and_the_switch_changes_the_version() -> None:
    default = load_default_policy()
    assert decide(default, _who("any"), _facts()).raw_prompt_special_tokens is True
    on = loads_policy(POLICY)
    off = loads_policy(POLICY.replace("raw_prompt_special_tokens = false", ""))
    assert on.version != off.version
