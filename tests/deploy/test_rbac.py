"""RBAC grants exactly what the code calls: kube/api_calls.API_CALLS plus kopf's own needs. No Secrets."""

from __future__ import annotations

from typing import Any

import pytest

from predictive_scaler import crd
from predictive_scaler.kube import api_calls, discovery, manifests
from predictive_scaler.kube.manifests import GROUP, PLURAL

from .support import OVERLAYS, find, one, render

Permission = tuple[str, str, str]  # (apiGroup, resource, verb)

OBJECTS = render(OVERLAYS["prometheus-operator"])  # the overlay with the most objects

#: What kopf itself does with the custom resource (it is not in API_CALLS): list and
#: watch it, patch it (its annotations and finalizers) and its status, post Events.
#: One replica with Recreate replaces leader election, so no Leases; run standalone,
#: so no kopf peering resources.
KOPF_NEEDS: frozenset[Permission] = frozenset({
    (GROUP, PLURAL, "list"),
    (GROUP, PLURAL, "watch"),
    (GROUP, PLURAL, "patch"),
    (GROUP, f"{PLURAL}/status", "patch"),
    ("", "events", "create"),
})

#: The retraining job: find the scalers, record why one was skipped.
RETRAIN_NEEDS: frozenset[Permission] = frozenset({
    (GROUP, PLURAL, "get"),
    (GROUP, PLURAL, "list"),
    (GROUP, f"{PLURAL}/status", "patch"),
})


def admission_needs() -> frozenset[Permission]:
    """What admission asks beyond the calls themselves. OwnerReferencesPermissionEnforcement (on in
    OpenShift) lets a client set ``blockOwnerDeletion`` only with ``update`` on the owner's
    ``finalizers``; the placeholder's ownerReference to its PredictiveScaler sets it."""
    owner = manifests.owner_reference("llm", "uid-1")
    if not owner.get("blockOwnerDeletion"):
        return frozenset()
    return frozenset({(GROUP, f"{PLURAL}/finalizers", "update")})


def _scalable_builtins() -> set[tuple[str, str]]:
    # The adapter's table of built-in kinds with /scale; other kinds need the user's own rule.
    return {(group, plural) for (group, _kind), plural in discovery.BUILTIN_SCALABLE.items()}


def adapter_needs() -> frozenset[Permission]:
    """API_CALLS as RBAC permissions; the target's templated /scale rows expand to the built-in kinds."""
    out: set[Permission] = set()
    for call in api_calls.API_CALLS:
        if not call.resource:
            continue  # discovery: non-resource URLs every authenticated user may read
        if "{plural}" in call.resource:
            is_core = call.path.startswith("/api/v1/")
            for group, plural in _scalable_builtins():
                if (group == "") == is_core:
                    out.add((group, call.resource.replace("{plural}", plural), call.verb))
        else:
            out.add((call.group, call.resource, call.verb))
    return frozenset(out)


def granted(role: dict[str, Any]) -> frozenset[Permission]:
    out: set[Permission] = set()
    for rule in role["rules"]:
        assert "nonResourceURLs" not in rule, "discovery needs no rule (system:discovery grants it)"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    out.add((group, resource, verb))
    return frozenset(out)


def _role_of(service_account: str) -> dict[str, Any]:
    (binding,) = [b for b in find(OBJECTS, "ClusterRoleBinding") + find(OBJECTS, "RoleBinding")
                  if any(s["name"] == service_account for s in b["subjects"])]
    return one(OBJECTS, binding["roleRef"]["kind"], binding["roleRef"]["name"])


def test_controller_role_is_exactly_the_adapter_calls_plus_kopf():
    needed = adapter_needs() | KOPF_NEEDS | admission_needs()
    have = granted(_role_of("predictive-scaler-controller"))
    assert have - needed == set(), f"granted but never called: {sorted(have - needed)}"
    assert needed - have == set(), f"called but not granted: {sorted(needed - have)}"


def test_placeholder_owner_reference_is_allowed_under_owner_reference_enforcement():
    # Before: the role granted nothing on predictivescalers/finalizers, and a real API server with
    # OwnerReferencesPermissionEnforcement refused the placeholder with 403 (tests/e2e shows it).
    have = granted(_role_of("predictive-scaler-controller"))
    assert (GROUP, f"{PLURAL}/finalizers", "update") in have
    assert admission_needs() <= have


def test_retrain_role_is_exactly_what_the_job_needs():
    assert granted(_role_of("predictive-scaler-retrain")) == RETRAIN_NEEDS


@pytest.mark.parametrize("role", find(OBJECTS, "ClusterRole") + find(OBJECTS, "Role"),
                         ids=lambda r: r["metadata"]["name"])
def test_no_secrets_no_wildcards_no_escalation(role):
    for rule in role["rules"]:
        assert "secrets" not in rule["resources"]
        assert "*" not in rule["resources"] and "*" not in rule["verbs"] and "*" not in rule["apiGroups"]
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
        assert not {"roles", "clusterroles", "rolebindings", "clusterrolebindings"} & set(rule["resources"])


def test_service_accounts_are_the_ones_the_pods_use():
    accounts = {sa["metadata"]["name"] for sa in find(OBJECTS, "ServiceAccount")}
    used = {o["spec"]["template"]["spec"]["serviceAccountName"] for o in find(OBJECTS, "Deployment")}
    used |= {o["spec"]["jobTemplate"]["spec"]["template"]["spec"]["serviceAccountName"]
             for o in find(OBJECTS, "CronJob")}
    assert used == accounts
    for binding in find(OBJECTS, "ClusterRoleBinding"):
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount" and subject["namespace"] == crd.CONTROLLER_NAMESPACE


def test_expansion_covers_every_api_call():
    # Guards the comparison above: each adapter call maps to at least one granted permission.
    have = granted(_role_of("predictive-scaler-controller"))
    for call in api_calls.API_CALLS:
        if call.resource:
            assert any(verb == call.verb and (call.resource == res or "{plural}" in call.resource)
                       for _, res, verb in have), call


def test_priority_class_is_the_adapter_one():
    pc = one(OBJECTS, "PriorityClass")
    expected = manifests.placeholder_priority_class()
    for key in ("value", "preemptionPolicy", "globalDefault"):
        assert pc[key] == expected[key], key
    assert pc["metadata"]["name"] == expected["metadata"]["name"]
