"""policies: decide() by tables of cases, the policy version, loader errors, lint and the shipped
default policy, plus a property: decide never raises and never allows past a cap."""

from __future__ import annotations

from fnmatch import fnmatchcase
from importlib import resources
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import (
    Decision,
    Judge,
    Limits,
    PolicyDocument,
    PolicyError,
    PolicySet,
    Principal,
    RequestFacts,
    Rule,
    can_use_model,
    decide,
    lint,
    load_default_policy,
    load_policy_dir,
    loads_policy,
    matching_rule,
    policy_set,
)

POLICY = """
name = "t"

# first match wins: this rule decides for contractors even though "apps" would allow them
[[rules]]
name = "blocked"
teams = ["contractors"]
roles = ["app"]
deny_models = ["*"]

[[rules]]
name = "research"
teams = ["research-*", "lab"]
roles = ["app"]
models = ["*"]
deny_models = ["*-preview"]
max_tokens = 8192
max_n = 4
max_prompt_bytes = 4096
requests_per_minute = 100
tokens_per_minute = 1000
concurrent_streams = 2
engine_classes = ["gpu"]
audit_level = "minimal"

[[rules]]
name = "apps"
roles = ["app"]
models = ["gemma-*", "llama-8b"]
max_tokens = 1024
max_n = 1
max_prompt_bytes = 1000
requests_per_minute = 600

[[rules]]
name = "admins"
roles = ["admin"]
models = ["*"]
"""


@pytest.fixture(scope="module")
def policy() -> PolicySet:
    return loads_policy(POLICY, "t.toml")


def _who(team: str | None = "payments", *roles: str) -> Principal:
    return Principal("key-1", team, frozenset(roles or ("app",)), "svc")


def _ask(
    model: str = "gemma-3",
    engine: str = "edge",
    max_tokens: int | None = None,
    n: int = 1,
    prompt_bytes: int = 10,
    action: str = "chat.completions",
) -> RequestFacts:
    classes = frozenset(engine.split("+"))
    return RequestFacts(
        model,
        classes,  # type: ignore[arg-type]
        max_tokens,
        n,
        prompt_bytes,
        True,
        action=action,  # type: ignore[arg-type]
    )


# (case, principal, request, allowed, code, rule, effective_max_tokens)
DECIDE_CASES = [
    ("app gets the cap as default max_tokens", _who(), _ask(), True, "allowed", "t/apps", 1024),
    ("explicit max_tokens kept", _who(), _ask(max_tokens=512), True, "allowed", "t/apps", 512),
    ("max_tokens at the cap", _who(), _ask(max_tokens=1024), True, "allowed", "t/apps", 1024),
    (
        "max_tokens above the cap",
        _who(),
        _ask(max_tokens=1025),
        False,
        "max_tokens_exceeded",
        "t/apps",
        1025,
    ),
    ("n above max_n", _who(), _ask(n=2), False, "n_exceeded", "t/apps", 1024),
    ("prompt at the cap", _who(), _ask(prompt_bytes=1000), True, "allowed", "t/apps", 1024),
    (
        "prompt above the cap",
        _who(),
        _ask(prompt_bytes=1001),
        False,
        "prompt_too_large",
        "t/apps",
        1024,
    ),
    ("second model glob", _who(), _ask("llama-8b"), True, "allowed", "t/apps", 1024),
    (
        "model in no glob",
        _who(),
        _ask("llama-70b"),
        False,
        "model_not_allowed",
        "t/apps",
        1024,
    ),
    ("team None matches *", _who(None), _ask(), True, "allowed", "t/apps", 1024),
    (
        "team glob",
        _who("research-nlp"),
        _ask("llama-70b", "gpu"),
        True,
        "allowed",
        "t/research",
        8192,
    ),
    (
        "second team glob",
        _who("lab"),
        _ask("llama-70b", "gpu"),
        True,
        "allowed",
        "t/research",
        8192,
    ),
    (
        "glob is not a prefix match",
        _who("research"),
        _ask("llama-70b", "gpu"),
        False,
        "model_not_allowed",
        "t/apps",
        1024,
    ),
    (
        "team glob does not match None",
        _who(None),
        _ask("llama-70b", "gpu"),
        False,
        "model_not_allowed",
        "t/apps",
        1024,
    ),
    (
        "engine class not allowed",
        _who("research-nlp"),
        _ask("llama-70b", "edge"),
        False,
        "engine_class_not_allowed",
        "t/research",
        8192,
    ),
    (
        "one allowed class among the model's deployments suffices",
        _who("research-nlp"),
        _ask("llama-70b", "gpu+edge"),
        True,
        "allowed",
        "t/research",
        8192,
    ),
    (
        "deny_models beats models",
        _who("research-nlp"),
        _ask("gemma-4-preview", "gpu"),
        False,
        "model_not_allowed",
        "t/research",
        8192,
    ),
    (
        "first match wins over a later, more generous rule",
        _who("contractors"),
        _ask(),
        False,
        "model_not_allowed",
        "t/blocked",
        None,
    ),
    (
        "first match wins over a later, stricter rule",
        _who("research-nlp"),
        _ask("gemma-3", "gpu", max_tokens=5000, n=4, prompt_bytes=4096),
        True,
        "allowed",
        "t/research",
        5000,
    ),
    (
        "role glob: admin",
        _who("x", "admin"),
        _ask(max_tokens=10**6),
        True,
        "allowed",
        "t/admins",
        10**6,
    ),
    ("no cap and none asked", _who("x", "admin"), _ask(), True, "allowed", "t/admins", None),
    (
        "any shared role matches",
        _who("x", "auditor", "admin"),
        _ask(),
        True,
        "allowed",
        "t/admins",
        None,
    ),
    ("default deny: auditor", _who("x", "auditor"), _ask(), False, "no_matching_rule", None, None),
    (
        "default deny: unknown role",
        _who("x", "root"),
        _ask(),
        False,
        "no_matching_rule",
        None,
        None,
    ),
    (
        "model is checked before caps",
        _who(),
        _ask("llama-70b", max_tokens=10**6, n=9, prompt_bytes=10**6),
        False,
        "model_not_allowed",
        "t/apps",
        10**6,
    ),
    (
        "engine class is checked before caps",
        _who("lab"),
        _ask("x", "edge", max_tokens=10**6),
        False,
        "engine_class_not_allowed",
        "t/research",
        10**6,
    ),
    (
        "max_tokens is checked before n and prompt",
        _who(),
        _ask(max_tokens=2000, n=9, prompt_bytes=10**6),
        False,
        "max_tokens_exceeded",
        "t/apps",
        2000,
    ),
    (
        "n is checked before prompt",
        _who(),
        _ask(n=9, prompt_bytes=10**6),
        False,
        "n_exceeded",
        "t/apps",
        1024,
    ),
]


@pytest.mark.parametrize(
    ("principal", "request_facts", "allowed", "code", "rule", "effective"),
    [case[1:] for case in DECIDE_CASES],
    ids=[case[0] for case in DECIDE_CASES],
)
def test_decide(
    policy: PolicySet,
    principal: Principal,
    request_facts: RequestFacts,
    allowed: bool,
    code: str,
    rule: str | None,
    effective: int | None,
) -> None:
    decision = decide(policy, principal, request_facts)
    assert (decision.allowed, decision.code, decision.rule) == (allowed, code, rule)
    assert decision.effective_max_tokens == effective
    assert decision.policy_version == policy.version
    assert request_facts.model not in decision.message  # never request content
    assert (decision.message == "allowed") == allowed


def test_decision_carries_the_rule_limits_and_audit_level(policy: PolicySet) -> None:
    research = decide(policy, _who("lab"), _ask("x", "gpu"))
    assert research.limits == Limits(
        requests_per_minute=100, tokens_per_minute=1000, concurrent_streams=2, max_tokens=8192
    )
    assert research.audit_level == "minimal"
    assert research.engine_classes == {"gpu"}
    apps = decide(policy, _who(), _ask(n=5))  # denied: still the deciding rule's limits
    assert apps.limits == Limits(600, None, None, 1024)
    assert apps.audit_level == "metadata"
    assert apps.engine_classes == {"gpu", "edge"}
    nothing = decide(policy, _who("x", "auditor"), _ask())
    assert nothing.limits == Limits()
    assert nothing.audit_level == "metadata"
    assert nothing.engine_classes == frozenset()


@pytest.mark.parametrize(
    ("code", "request_facts", "message"),
    [
        ("max_tokens_exceeded", _ask(max_tokens=4000), "max_tokens may be at most 1024"),
        ("n_exceeded", _ask(n=3), "n may be at most 1"),
        ("prompt_too_large", _ask(prompt_bytes=5000), "the prompt may be at most 1000 bytes"),
        ("model_not_allowed", _ask("secret-model"), "may not use the requested model"),
    ],
)
def test_messages_name_the_limit(
    policy: PolicySet, code: str, request_facts: RequestFacts, message: str
) -> None:
    decision = decide(policy, _who(), request_facts)
    assert decision.code == code
    assert message in decision.message
    assert "secret" not in decision.message and "4000" not in decision.message


@pytest.mark.parametrize(
    ("principal", "model", "usable"),
    [
        (_who(), "gemma-3", True),
        (_who(), "llama-8b", True),
        (_who(), "llama-70b", False),
        (_who("research-x"), "llama-70b", True),
        (_who("research-x"), "gemma-9-preview", False),
        (_who("contractors"), "gemma-3", False),
        (_who("x", "admin"), "anything", True),
        (_who("x", "auditor"), "gemma-3", False),
    ],
)
def test_can_use_model(policy: PolicySet, principal: Principal, model: str, usable: bool) -> None:
    assert can_use_model(policy, principal, model) is usable


def test_documents_are_read_in_order(tmp_path: Path) -> None:
    (tmp_path / "20-all.toml").write_text(
        'name = "all"\n[[rules]]\nname = "apps"\nroles = ["app"]\nmodels = ["*"]\n'
    )
    (tmp_path / "10-team.toml").write_text(
        'name = "team"\n[[rules]]\nname = "a"\nteams = ["a"]\nroles = ["app"]\nmodels = ["small"]\n'
    )
    (tmp_path / "notes.txt").write_text("not a policy")
    (tmp_path / ".hidden.toml").write_text("not = [toml")
    policy = load_policy_dir(tmp_path)
    assert policy.sources == ("10-team.toml", "20-all.toml")
    assert decide(policy, _who("a"), _ask("big")).code == "model_not_allowed"
    assert decide(policy, _who("b"), _ask("big")).rule == "all/apps"


# ---- version


def test_version_ignores_formatting_and_spelled_out_defaults(policy: PolicySet) -> None:
    reformatted = """
# same policy, other spelling: key order, comments, number syntax, spelled-out defaults
name="t"   # trailing comment
[[rules]]
roles = [ "app" ]
name = 'blocked'
teams = [
    "contractors",
]
deny_models = ["*"]
[[rules]]
name = "research"
audit_level = "minimal"
engine_classes = ["gpu"]
concurrent_streams = 2
tokens_per_minute = 1_000
requests_per_minute = 100
max_prompt_bytes = 0x1000
max_n = 4
max_tokens = 8_192
deny_models = ["*-preview"]
models = ["*"]
teams = ["research-*", "lab"]
roles = ["app"]
[[rules]]
name = "apps"
teams = ["*"]
roles = ["app"]
models = ["gemma-*", "llama-8b"]
max_tokens = 1024
max_n = 1
max_prompt_bytes = 1000
requests_per_minute = 600
engine_classes = ["gpu", "edge"]
audit_level = "metadata"

[[rules]]
models = ["*"]
roles = ["admin"]
name = "admins"
"""
    again = loads_policy(reformatted, "other-name.toml")
    assert again.version == policy.version
    assert len(policy.version) == 16 and int(policy.version, 16) >= 0


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("max_tokens = 1024", "max_tokens = 1025"),
        ('models = ["gemma-*", "llama-8b"]', 'models = ["gemma-*"]'),
        ('name = "admins"', 'name = "admin"'),
        ('audit_level = "minimal"', 'audit_level = "metadata"'),
        ('teams = ["contractors"]', 'teams = ["contractor"]'),
    ],
)
def test_version_changes_with_any_value(policy: PolicySet, old: str, new: str) -> None:
    assert old in POLICY
    assert loads_policy(POLICY.replace(old, new)).version != policy.version


def test_version_changes_with_rule_order(policy: PolicySet) -> None:
    document = policy.documents[0]
    swapped = msgspec.structs.replace(document, rules=document.rules[::-1])
    assert policy_set([swapped]).version != policy.version
    assert policy_set([document]).version == policy.version


# ---- loader errors


def _rules(*bodies: str) -> str:
    return 'name = "team-a"\n' + "".join(
        f'[[rules]]\nname = "r{i}"\n{b}\n' for i, b in enumerate(bodies)
    )


@pytest.mark.parametrize(
    ("text", "key", "message"),
    [
        (_rules("", "", "max_tokens = 0"), "rules[2].max_tokens", "Expected int >= 1"),
        (_rules("max_token = 5"), "rules[0].max_token", "unknown key"),
        ('name = "x"\nrule = []', "rule", "unknown key"),
        (
            _rules('roles = ["app", "superuser"]'),
            "rules[0].roles[1]",
            "Invalid enum value 'superuser'",
        ),
        (
            _rules('engine_classes = ["tpu"]'),
            "rules[0].engine_classes[0]",
            "Invalid enum value 'tpu'",
        ),
        (_rules("teams = []"), "rules[0].teams", "Expected array of length >= 1"),
        (_rules("roles = []"), "rules[0].roles", "Expected array of length >= 1"),
        (_rules('max_n = "1"'), "rules[0].max_n", "Expected int | null, got str"),
        (_rules("max_n = true"), "rules[0].max_n", "Expected int | null, got bool"),
        (_rules('audit_level = "full"'), "rules[0].audit_level", "Invalid enum value 'full'"),
        (_rules('models = ["a b"]'), "rules[0].models[0]", "Expected str matching regex"),
        ("[[rules]]\nname = 'r'", "name", "missing required key"),
        ('name = "x"\n[[rules]]\nmodels = ["*"]', "rules[0].name", "missing required key"),
        ('name = "no spaces please"', "name", "Expected str matching regex"),
    ],
)
def test_loader_errors_name_file_and_key(tmp_path: Path, text: str, key: str, message: str) -> None:
    (tmp_path / "team-a.toml").write_text(text)
    (tmp_path / "team-b.toml").write_text('name = "b"')
    with pytest.raises(PolicyError) as caught:
        load_policy_dir(tmp_path)
    assert str(caught.value).startswith(f"team-a.toml: {key}: {message}")
    assert (caught.value.file, caught.value.key) == ("team-a.toml", key)


def test_loader_error_example_from_the_docs(tmp_path: Path) -> None:
    path = tmp_path / "team-a.toml"
    path.write_text(_rules("", "", "max_tokens = 0"))
    with pytest.raises(
        PolicyError, match=r"^team-a\.toml: rules\[2\]\.max_tokens: Expected int >= 1$"
    ):
        load_policy_dir(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"name = [", "team-a.toml: not valid TOML: "),
        (b'name = "\xff"', "team-a.toml: not UTF-8 text"),
    ],
)
def test_unreadable_files(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / "team-a.toml").write_bytes(content)
    with pytest.raises(PolicyError) as caught:
        load_policy_dir(tmp_path)
    assert str(caught.value).startswith(message)
    assert caught.value.key is None


def test_missing_and_empty_paths(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"no \*\.toml policy files"):
        load_policy_dir(tmp_path)
    with pytest.raises(PolicyError, match="no such file or directory"):
        load_policy_dir(tmp_path / "nope")


# ---- lint


def _lint_text(tmp_path: Path, *texts: str) -> list[str]:
    for index, text in enumerate(texts):
        (tmp_path / f"{index}0-p.toml").write_text(text)
    return lint(tmp_path)


def test_lint_clean(tmp_path: Path) -> None:
    assert _lint_text(tmp_path, POLICY) == []


@pytest.mark.parametrize(
    ("rules", "expected"),
    [
        (
            ('roles = ["app"]\nmodels = ["*"]', 'teams = ["x"]\nroles = ["app"]\nmodels = ["a"]'),
            [
                "00-p.toml: rules[1]: warning: rule 'team-a/r1' is unreachable: every principal it "
                "matches is matched first by 'team-a/r0'"
            ],
        ),
        (  # one earlier rule per role: together they shadow
            (
                'roles = ["app"]\nmodels = ["*"]',
                'roles = ["admin"]\nteams = ["team-*", "ops"]\nmodels = ["*"]',
                'roles = ["app", "admin"]\nteams = ["team-a"]\nmodels = ["*"]',
            ),
            [
                "00-p.toml: rules[2]: warning: rule 'team-a/r2' is unreachable: every principal it "
                "matches is matched first by 'team-a/r0', 'team-a/r1'"
            ],
        ),
        (  # a role the earlier rule lacks keeps the later rule reachable
            ('roles = ["app"]\nmodels = ["*"]', 'roles = ["app", "admin"]\nmodels = ["*"]'),
            [],
        ),
        (  # a team the earlier globs miss keeps it reachable
            ('teams = ["team-*"]\nmodels = ["*"]', 'teams = ["team-a", "ops"]\nmodels = ["*"]'),
            [],
        ),
        (  # glob against glob is only compared literally: no false alarm
            ('teams = ["team-*"]\nmodels = ["*"]', 'teams = ["team-[ab]"]\nmodels = ["*"]'),
            [],
        ),
        (
            ('teams = ["team-*"]\nmodels = ["*"]', 'teams = ["team-*"]\nmodels = ["*"]'),
            [
                "00-p.toml: rules[1]: warning: rule 'team-a/r1' is unreachable: every principal it "
                "matches is matched first by 'team-a/r0'"
            ],
        ),
        (
            ('roles = ["app", "auditor"]',),
            [
                "00-p.toml: rules[0]: warning: rule 'team-a/r0' matches the app role but allows "
                'no model, so it denies every request it decides (write deny_models = ["*"] if '
                "that is the intent)"
            ],
        ),
        (('roles = ["auditor"]',), []),
        (('roles = ["app"]\ndeny_models = ["*"]',), []),
    ],
)
def test_lint_warnings(tmp_path: Path, rules: tuple[str, ...], expected: list[str]) -> None:
    assert _lint_text(tmp_path, _rules(*rules)) == expected


def test_lint_duplicate_names_and_empty_documents(tmp_path: Path) -> None:
    one = 'name = "d"\n[[rules]]\nname = "r"\nteams = ["a"]\nmodels = ["*"]\n'
    two = 'name = "d"\n[[rules]]\nname = "r"\nteams = ["b"]\nmodels = ["*"]\n'
    same_file = one + '[[rules]]\nname = "r"\nteams = ["c"]\nmodels = ["*"]\n'
    assert _lint_text(tmp_path, same_file, two, 'name = "empty"') == [
        "00-p.toml: rules[1]: warning: rule name 'd/r' is already used (00-p.toml: rules[0])",
        "10-p.toml: rules[0]: warning: rule name 'd/r' is already used (00-p.toml: rules[0])",
        "20-p.toml: warning: document 'empty' has no rules",
    ]


def test_lint_shadowing_across_files_and_every_parse_error(tmp_path: Path) -> None:
    findings = _lint_text(
        tmp_path,
        'name = "all"\n[[rules]]\nname = "everyone"\nmodels = ["*"]',
        "name = [",
        'name = "late"\n[[rules]]\nname = "x"\nteams = ["x"]\nroles = ["admin"]\nmodels = ["*"]',
        'name = "bad"\n[[rules]]\nname = "r"\nroles = ["root"]',
    )
    assert len(findings) == 3
    assert findings[0].startswith("10-p.toml: not valid TOML")
    assert findings[1] == "30-p.toml: rules[0].roles[0]: Invalid enum value 'root'"
    assert findings[2] == (
        "20-p.toml: rules[0]: warning: rule 'late/x' is unreachable: every principal it matches "
        "is matched first by 'all/everyone'"
    )


def test_lint_missing_path(tmp_path: Path) -> None:
    assert lint(tmp_path / "nope") == [f"{tmp_path / 'nope'}: no such file or directory"]


# ---- the shipped default


def _default_file() -> Path:
    return Path(str(resources.files("policies").joinpath("default.toml")))


def test_default_policy_is_clean_and_loads_like_a_file() -> None:
    default = load_default_policy()
    assert lint(_default_file()) == []
    assert load_policy_dir(_default_file()).version == default.version
    assert default.sources == ("default.toml",)


@pytest.mark.parametrize("team", [None, "payments", "research-nlp"])
@pytest.mark.parametrize("role", ["app", "admin"])
@pytest.mark.parametrize("engine", ["gpu", "edge"])
def test_default_policy_lets_apps_and_admins_infer(
    team: str | None, role: str, engine: str
) -> None:
    default = load_default_policy()
    decision = decide(default, _who(team, role), _ask("any/model:7b", engine))
    assert (decision.allowed, decision.rule) == (True, "default/inference")
    assert decision.effective_max_tokens == 4096
    assert decision.limits == Limits(
        requests_per_minute=600, tokens_per_minute=200_000, concurrent_streams=16, max_tokens=4096
    )
    assert decision.audit_level == "metadata"
    assert can_use_model(default, _who(team, role), "gemma-3-270m")


@pytest.mark.parametrize(
    ("request_facts", "code"),
    [
        (_ask(max_tokens=4096, n=1, prompt_bytes=1 << 20), "allowed"),
        (_ask(max_tokens=4097), "max_tokens_exceeded"),
        (_ask(n=8), "allowed"),
        (_ask(n=9), "n_exceeded"),
        (_ask(prompt_bytes=(1 << 20) + 1), "prompt_too_large"),
    ],
)
def test_default_policy_caps(request_facts: RequestFacts, code: str) -> None:
    assert decide(load_default_policy(), _who(), request_facts).code == code


def test_default_policy_gives_auditors_no_inference() -> None:
    default = load_default_policy()
    auditor = _who("compliance", "auditor")
    decision = decide(default, auditor, _ask())
    assert (decision.allowed, decision.code, decision.rule) == (
        False,
        "model_not_allowed",
        "default/auditors",
    )
    assert not can_use_model(default, auditor, "gemma-3")
    assert decide(default, _who("x", "root"), _ask()).code == "no_matching_rule"


# ---- property: decide never raises, and `allowed` respects every cap

TEAMS = ["a", "b", "team-a", "research-x", ""]
MODELS = ["gemma-3", "llama-8b", "x-preview", "m"]
caps = st.none() | st.integers(1, 3000)


def _globs(
    choices: list[str], min_size: int = 0, max_size: int = 3
) -> st.SearchStrategy[tuple[str, ...]]:
    return st.lists(st.sampled_from(choices), min_size=min_size, max_size=max_size).map(tuple)


# "*" is listed more than once so that allowed decisions are common enough to check
rules = st.builds(
    Rule,
    name=st.sampled_from(["r1", "r2", "r3"]),
    teams=_globs(["*", "*", "*", "a", "team-a", "team-*", "research-?", "[ab]"], min_size=1),
    roles=_globs(["app", "auditor", "admin"], min_size=1),
    models=_globs(["*", "*", "gemma-*", "*-preview", "llama-?b", *MODELS]),
    deny_models=_globs(["*-preview", "gemma-*", *MODELS], max_size=1),
    max_tokens=caps,
    max_n=st.none() | st.integers(1, 4),
    max_prompt_bytes=caps,
    # limits are only handed on: two values each are enough
    requests_per_minute=st.sampled_from([None, 60]),
    tokens_per_minute=st.sampled_from([None, 1000]),
    concurrent_streams=st.sampled_from([None, 2]),
    engine_classes=st.sampled_from([("gpu",), ("edge",), ("gpu", "edge")]),
    audit_level=st.sampled_from(["metadata", "minimal"]),
)
documents = st.builds(
    PolicyDocument,
    name=st.sampled_from(["d1", "d2"]),
    rules=st.lists(rules, min_size=1, max_size=3).map(tuple),
)
principals = st.builds(
    Principal,
    key_id=st.just("k"),
    team=st.none() | st.sampled_from(TEAMS),
    roles=st.frozensets(
        st.sampled_from(["app", "auditor", "admin", "other"]), min_size=1, max_size=2
    ),
    subject=st.none() | st.just("s"),
)
requests = st.builds(
    RequestFacts,
    model=st.sampled_from(MODELS),
    engine_classes=st.sampled_from(
        [frozenset({"gpu"}), frozenset({"edge"}), frozenset({"gpu", "edge"})]
    ),
    max_tokens=st.none() | st.integers(-5, 4000),
    n=st.integers(-1, 6),
    prompt_bytes=st.integers(0, 4000),
    stream=st.booleans(),
)


def _first_rule(policy: PolicySet, principal: Principal) -> tuple[str, Rule] | None:
    # a second, naive reading of "first match wins"
    for document in policy.documents:
        for rule in document.rules:
            team_ok = any(fnmatchcase(principal.team or "", g) for g in rule.teams)
            if team_ok and any(role in principal.roles for role in rule.roles):
                return f"{document.name}/{rule.name}", rule
    return None


@settings(deadline=None, max_examples=300)
@given(st.lists(documents, min_size=1, max_size=2), principals, requests)
def test_decide_never_raises_and_allowed_respects_every_cap(
    docs: list[PolicyDocument], principal: Principal, request: RequestFacts
) -> None:
    policy = policy_set(docs)
    decision = decide(policy, principal, request)
    assert isinstance(decision, Decision)
    assert decision.policy_version == policy.version
    assert decision.allowed == (decision.code == "allowed")
    first = _first_rule(policy, principal)
    assert matching_rule(policy, principal) == first
    if first is None:
        assert (decision.allowed, decision.code, decision.rule) == (False, "no_matching_rule", None)
        return
    name, rule = first
    assert decision.rule == name
    assert decision.limits == Limits(
        rule.requests_per_minute, rule.tokens_per_minute, rule.concurrent_streams, rule.max_tokens
    )
    if not decision.allowed:
        return
    assert can_use_model(policy, principal, request.model)
    assert any(fnmatchcase(request.model, g) for g in rule.models)
    assert not any(fnmatchcase(request.model, g) for g in rule.deny_models)
    assert not request.engine_classes.isdisjoint(rule.engine_classes)
    if rule.max_tokens is not None:
        assert decision.effective_max_tokens is not None
        assert decision.effective_max_tokens <= rule.max_tokens
    if request.max_tokens is not None:
        assert decision.effective_max_tokens == request.max_tokens
    if rule.max_n is not None:
        assert request.n <= rule.max_n
    if rule.max_prompt_bytes is not None:
        assert request.prompt_bytes <= rule.max_prompt_bytes


@settings(deadline=None, max_examples=200)
@given(
    st.lists(documents, min_size=1, max_size=2),
    st.lists(st.tuples(principals, requests), min_size=1, max_size=12),
    st.integers(1, 4),
)
def test_judge_decides_as_decide_whatever_it_remembers(
    docs: list[PolicyDocument], asks: list[tuple[Principal, RequestFacts]], size: int
) -> None:
    # the same principals and models asked again, in any order, through a memory small enough
    # to be cleared in between: every answer equals the pure function's
    policy = policy_set(docs)
    judge = Judge(policy, size=size)
    for principal, request in asks + asks[::-1]:
        assert judge.decide(principal, request) == decide(policy, principal, request)


def test_judge_remembers_per_principal_and_model(policy: PolicySet) -> None:
    judge = Judge(policy)
    who, other = _who("payments", "app"), _who(None, "auditor")
    first = judge.decide(who, _ask())
    assert first == decide(policy, who, _ask())
    # the rule scan is not redone: the second decision shares the first one's Limits object
    assert judge.decide(who, _ask(max_tokens=1)).limits is first.limits
    assert judge.decide(other, _ask()) == decide(policy, other, _ask())


# ---- actions: which endpoints a rule allows, and its models per action ------------------------

ACTION_POLICY = """
name = "t"

[[rules]]
name = "search"
teams = ["search"]
models = ["gemma-*"]
actions = ["chat.completions", "responses", "embeddings"]
action_models = { embeddings = ["minilm-*"] }
"""


@pytest.mark.parametrize(
    ("model", "action", "code"),
    [
        ("gemma-3", "chat.completions", "allowed"),
        ("gemma-3", "responses", "allowed"),
        ("gemma-3", "completions", "action_not_allowed"),
        ("minilm-l6", "embeddings", "allowed"),
        ("gemma-3", "embeddings", "model_not_allowed"),  # action_models replaces models
        ("minilm-l6", "chat.completions", "model_not_allowed"),
    ],
)
def test_actions_and_models_per_action(model: str, action: str, code: str) -> None:
    policy = loads_policy(ACTION_POLICY)
    request = _ask(model, action=action)
    assert decide(policy, _who("search"), request).code == code
    assert Judge(policy).decide(_who("search"), request).code == code  # the cached path too


def test_a_model_is_listed_when_some_action_may_use_it() -> None:
    policy = loads_policy(ACTION_POLICY)
    assert can_use_model(policy, _who("search"), "minilm-l6")
    assert can_use_model(policy, _who("search"), "gemma-3")
    assert not can_use_model(policy, _who("search"), "llama-3")


def test_an_unknown_action_is_refused_when_loading() -> None:
    with pytest.raises(PolicyError) as info:
        loads_policy(ACTION_POLICY.replace('"responses"', '"images"'))
    assert "rules[0].actions[1]" in str(info.value)
