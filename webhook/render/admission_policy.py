"""The policy file as built-in admission policies: swapwise without a webhook.

Per profile (and per namespace override) this renders a ``MutatingAdmissionPolicy`` whose
one JSONPatch mutation, written in CEL, computes what :func:`webhook.engine.mutate_pod`
computes (docs/admission-policy.md lists where it cannot), its binding (same namespace
label and skip rules as the webhook), and a ``ValidatingAdmissionPolicy`` with the ``Warn``
action that repeats the webhook's per-container warnings.

Pure: a compiled :class:`~webhook.policy.Policy` in, a list of Kubernetes objects (dicts)
out. Profile values are written into the CEL as constants, so the objects stand alone
(no params object to keep in sync). A profile whose values cannot be computed exactly with
CEL's 64-bit integers is refused with :class:`Unrenderable`, naming the field; then nothing
is rendered at all.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

# Every rule's CEL form sits beside its Python one (base/quantity.py, engine/*, profile.py);
# this module composes them into objects. Short names for the helpers the CEL below is
# dense with.
from webhook.base.cel import cel_literal as lit
from webhook.base.cel import cel_string as q
from webhook.base.quantity import INT64_SAFE, MI, cel_parse_bytes, cel_positive, format_bytes
from webhook.base.quantity import cel_format_bytes as fmt
from webhook.engine.annotations import (
    RECORDED_LIMIT,
    RECORDED_PARTS,
    RECORDED_REQUEST,
    cel_entry,
    cel_has_entry,
    cel_merged,
    cel_recorded,
)
from webhook.engine.backing import PERMILLE_LABEL, container_need
from webhook.engine.backing import cel_container_need as need_cel
from webhook.engine.mutate import BACKING_WARNING
from webhook.engine.placement import (
    MAX_DIGITS,
    PREFERRED,
    REQUIRED,
    backing_expression,
    cel_toleration_equal,
    pressure_expressions,
    unique_tolerations,
)
from webhook.engine.pod import (
    CEL_CONTAINERS_GUARANTEED,
    CEL_POD_BEST_EFFORT,
    CEL_POD_GUARANTEED,
    CEL_POD_LEVEL,
    CRITICAL_CLASSES,
    CRITICAL_PRIORITY,
    MAX_CONTAINERS,
    MAX_ITEMS,
    MIRROR_ANNOTATION,
    ORIGINAL_ANNOTATION,
    PROFILE_ANNOTATION,
    SKIP_KEY,
)
from webhook.engine.resize import RESTART
from webhook.engine.resources import cel_raised_limit, cel_target, target
from webhook.engine.selection import ALWAYS_EXCLUDED_NAMESPACES, NAME_LABEL, NAMESPACE_LABEL
from webhook.engine.vpa import cel_vpa_managed, cel_vpa_variables
from webhook.engine.warnings import (
    LIMIT_ADDED,
    LIMIT_NOT_ABOVE,
    LIMIT_RAISED,
    MAX_WARNING,
    REQUEST_LOWERED,
    REQUEST_NOT_BELOW,
    VPA_RAN_AFTER,
    VPA_SKIP,
    cel_format,
)
from webhook.policy import Policy
from webhook.profile import Profile

API_VERSIONS = ("v1", "v1beta1")
# cel-go's parser refuses an expression longer than this (in code points), and so does
# the API server: a policy holding one is refused as a whole.
MAX_EXPRESSION_LENGTH = 100_000
WARNING_SLOTS = 16  # one Warn validation per message; beyond these, one "N more" line
# (prefix of the variable names, CEL list, JSON Pointer of the list)
KINDS = (
    ("init", "object.spec.?initContainers.orValue([])", "/spec/initContainers"),
    ("app", "object.spec.containers", "/spec/containers"),
)


class Unrenderable(ValueError):
    """Profiles that CEL cannot compute exactly; ``errors`` has one line per field."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("cannot render admission policies:\n"
                         + "\n".join(f"  {e}" for e in errors))


# --------------------------------------------------------------------------- CEL of the pod


def op(kind: str, path: str, value: str) -> str:
    """One JSON Patch operation as a CEL map (``path`` and ``value`` are CEL expressions)."""
    return f"{{'op': dyn({q(kind)}), 'path': dyn({path}), 'value': dyn({value})}}"


# nodeSelectorTerms is the one list the pod's JSON tags give no omitempty: a NodeSelector
# without terms reaches CEL as null, which .orValue([]) keeps (and .size() then fails on).
REQUIRED_TERMS = (f"[object.spec.?affinity.?nodeAffinity.?{REQUIRED}.?nodeSelectorTerms"
                  ".orValue([])].map(ts, type(ts) == list ? ts : [])[0]")
# Which affinity objects the pod has: a patch adds the first one missing on the way.
NODE_AFFINITY = "object.spec.?affinity.?nodeAffinity"
AFFINITY_SET = " || ".join(f"object.spec.?affinity.?{f}.hasValue()"
                           for f in ("nodeAffinity", "podAffinity", "podAntiAffinity"))
NODE_AFFINITY_SET = (f"{NODE_AFFINITY}.?{REQUIRED}.hasValue() || "
                     f"{NODE_AFFINITY}.?{PREFERRED}.hasValue()")


# --------------------------------------------------------------------------- one profile


@dataclass(frozen=True)
class Target:
    """What a policy applies to: a profile, optionally narrowed to one override namespace."""

    profile: Profile
    namespace: str | None = None  # a namespace override
    others: tuple[str, ...] = ()  # namespaces with overrides, excluded from the base binding

    @property
    def name(self) -> str:
        base = f"swapwise-{self.profile.name}"
        return f"{base}-ns-{self.namespace}" if self.namespace else base


def check(target_: Target) -> list[str]:
    """Why this profile cannot be rendered (field names first); empty when it can."""
    p = target_.profile
    where = f"profiles.{p.name}" if target_.namespace is None else \
        f"namespaces.{target_.namespace} (profile {p.name})"
    errors: list[str] = []
    ratios = [("requestRatio/swapRatio", p.request_ratio)]
    if p.max_limit_request_ratio is not None:
        ratios.append(("maxLimitRequestRatio", p.max_limit_request_ratio))
    for field, ratio in ratios:
        if ratio.numerator * ratio.denominator * MI >= INT64_SAFE:
            errors.append(f"{where}.{field}: {float(ratio):g} has too many digits to be "
                          "computed exactly with CEL's 64-bit integers; round it")
    for field, value in (("minRequest", p.min_request), ("defaultLimit", p.default_limit)):
        if value is not None and value >= INT64_SAFE:
            errors.append(f"{where}.{field}: {format_bytes(value)} is beyond CEL's "
                          "64-bit integers")
    return errors


class _Cel:
    """The CEL of one profile: variables shared by the mutating and the warning policy."""

    def __init__(self, profile: Profile) -> None:
        self.p = profile
        placement = profile.placement
        # docs/rules.md "Swap backing": only with required placement, unless turned off
        self.backing = placement.mode == "required" and placement.swap_backing == "required"

    def match_conditions(self) -> list[dict[str, str]]:
        p = self.p
        ann = "object.metadata.?annotations.orValue({})"
        conditions = [
            ("not-opted-out",
             f"object.metadata.?labels[?{q(SKIP_KEY)}].orValue('') != 'true' && "
             f"object.metadata.?annotations[?{q(SKIP_KEY)}].orValue('') != 'true'"),
            ("not-critical",
             f"!(object.spec.?priorityClassName.orValue('') in {lit(sorted(CRITICAL_CLASSES))})"
             f" && object.spec.?priority.orValue(0) < {CRITICAL_PRIORITY}"
             f" && !({q(MIRROR_ANNOTATION)} in {ann})"),
            ("not-windows", "object.spec.?os.?name.orValue('') != 'windows'"),
            ("not-too-large",
             f"object.spec.?initContainers.orValue([]).size() + object.spec.containers.size()"
             f" <= {MAX_CONTAINERS} && object.spec.?tolerations.orValue([]).size() <= {MAX_ITEMS}"
             f" && {REQUIRED_TERMS}.size() <= {MAX_ITEMS}"),
        ]
        if p.pod_selector is not None:
            conditions.append(("pod-selector", p.pod_selector.cel_matches(
                "object.metadata.?labels.orValue({})")))
        if p.guaranteed_pods == "skip":
            conditions.append(("not-guaranteed", f"!({CEL_POD_LEVEL} ? {CEL_POD_GUARANTEED} : "
                                                  f"{CEL_CONTAINERS_GUARANTEED})"))
        return [{"name": name, "expression": expr} for name, expr in conditions]

    def variables(self) -> list[tuple[str, str]]:
        """Per-container lists (one per kind, indexed alike) and the pod-wide flags."""
        p = self.p
        out: list[tuple[str, str]] = cel_vpa_variables()
        default_target = target(p.default_limit, p) if p.default_limit is not None else 0
        default_changes = p.default_limit is not None and default_target < p.default_limit
        for kind, items, _ in KINDS:
            v = f"variables.{kind}"
            if kind == "app":
                vpa = f"{items}.transformList(i, c, {cel_vpa_managed('i', 'c.name')})"
            else:
                vpa = f"{items}.map(c, false)"  # a VPA never sets init containers
            raise_ = "true" if p.vpa_pods == "raiseLimit" else "false"
            default = "true" if p.default_limit is not None else "false"
            out += [
                (f"{kind}Req",
                 f"{items}.map(c, string(c.?resources.?requests[?'memory'].orValue('')))"),
                (f"{kind}Lim",
                 f"{items}.map(c, string(c.?resources.?limits[?'memory'].orValue('')))"),
                (f"{kind}LimB", f"{v}Lim.map(s, s == '' ? -1 : {cel_parse_bytes('s')})"),
                (f"{kind}Eq",
                 f"{v}Req.transformList(i, r, r != '' && {v}Lim[i] != '' && "
                 f"quantity(r) == quantity({v}Lim[i]))"),
                (f"{kind}Vpa", vpa),
                # 'target': request == limit; 'default': no memory at all, defaultLimit
                # given; 'vpa': a VPA sets the request, so the limit is raised instead
                (f"{kind}Mode",
                 f"{v}Req.transformList(i, r, {v}Vpa[i] ? ({raise_} && {v}Eq[i] ? 'vpa' : "
                 f"'none') : {v}Eq[i] ? 'target' : ({default} && r == '' && {v}Lim[i] == '') "
                 "? 'default' : 'none')"),
                (f"{kind}New",
                 f"{v}Mode.transformList(i, m, m == 'target' ? {cel_target(f'{v}LimB[i]', p)} : "
                 f"m == 'default' ? {default_target} : m == 'vpa' ? "
                 f"{cel_raised_limit(f'{v}LimB[i]', p)} : 0)"),
                (f"{kind}Chg",
                 f"{v}Mode.transformList(i, m, m == 'target' ? {v}New[i] < {v}LimB[i] : "
                 f"m == 'default' ? {'true' if default_changes else 'false'} : "
                 f"m == 'vpa' ? {v}New[i] > {v}LimB[i] : false)"),
                (f"{kind}NewS", f"{v}New.map(t, {fmt('t')})"),
                (f"{kind}Elig",
                 f"{v}Req.transformList(i, r, {v}Chg[i] || (r != '' && {cel_positive('r')} && "
                 f"!{v}Eq[i]))"),
            ]
        skip_vpa = p.vpa_pods == "skip"
        out += [
            ("vpaSkip", "variables.appVpa.exists(b, b)" if skip_vpa else "false"),
            ("anyChg", "!variables.vpaSkip && (variables.initChg.exists(b, b) || "
                       "variables.appChg.exists(b, b))"),
            ("anyElig", "variables.initElig.exists(b, b) || variables.appElig.exists(b, b)"),
            # placement is added (and the warning policy, on the mutated pod, finds it was)
            ("placement",
             "!variables.vpaSkip && object.spec.?nodeName.orValue('') == '' && "
             "!object.metadata.?ownerReferences.orValue([]).exists(o, o.kind == 'DaemonSet')"
             f" && ({CEL_POD_LEVEL} ? !({CEL_POD_GUARANTEED}) && !({CEL_POD_BEST_EFFORT}) && "
             "variables.anyElig : variables.anyChg || variables.anyElig)"),
        ]
        return out

    def warning_variables(self) -> list[tuple[str, str]]:
        """The warning policy's own variables, ending with ``msgs``: the webhook's warnings
        (one per container it changed or left unchanged, and the pod's swap-backing need),
        read off the mutated pod. What this admission changed is what
        ``swapwise.io/original`` records and the pod no longer has."""
        p = self.p
        orig = f"object.metadata.?annotations[?{q(ORIGINAL_ANNOTATION)}].orValue('')"
        out: list[tuple[str, str]] = []
        parts = []
        for kind, items, _ in KINDS:
            v = f"variables.{kind}"
            rec = cel_recorded(orig, "c.name")
            req, lim = f"{rec}[{RECORDED_REQUEST}]", f"{rec}[{RECORDED_LIMIT}]"
            now_req, now_lim = f"{v}Req[i]", f"{v}Lim[i]"
            added = cel_format(LIMIT_ADDED, name="c.name", limit=now_lim, request=now_req)
            raised = cel_format(LIMIT_RAISED, name="c.name", limit=lim, raised=now_lim,
                                request=req)
            lowered = cel_format(REQUEST_LOWERED, name="c.name", before=req, request=now_req,
                                 limit=lim)
            changed = (
                f"{cel_has_entry(orig, 'c.name')} ? ({rec}.size() < {RECORDED_PARTS} ? "
                f"{added} : {lim} != {now_lim} ? {raised} : {req} != {now_req} ? {lowered} : "
                "'') : ''"
            )
            limit_b = f"{v}LimB[i]"
            default_b = str(p.default_limit or 0)
            new = fmt(f"{v}New[i]")
            not_below = cel_format(REQUEST_NOT_BELOW, name="c.name", request=new,
                                   limit=fmt(limit_b))
            not_below_default = cel_format(REQUEST_NOT_BELOW, name="c.name", request=new,
                                           limit=fmt(default_b))
            not_above = cel_format(LIMIT_NOT_ABOVE, name="c.name", limit=new,
                                   request=fmt(limit_b))
            unchanged = (
                f"{v}Mode[i] == 'target' && !{v}Chg[i] ? {not_below} : "
                f"{v}Mode[i] == 'default' && !{v}Chg[i] ? {not_below_default} : "
                f"{v}Mode[i] == 'vpa' && !{v}Chg[i] ? {not_above} : ''"
            )
            out.append((f"{kind}Msg", f"{items}.transformList(i, c, {changed})"))
            parts.append(f"{items}.transformList(i, c, {v}Msg[i] != '' ? {v}Msg[i] : "
                         f"({unchanged}))")
            if self.backing:  # the need of each container changed, from its pod values now
                out.append((
                    f"{kind}Did",
                    f"{items}.transformList(i, c, {v}Msg[i] == '' || {v}Req[i] == '' ? 0 : "
                    f"[{cel_parse_bytes(f'{v}Req[i]')}].map(r, r > 0 && r < {v}LimB[i] ? "
                    f"{need_cel('r', f'{v}LimB[i]')} : 0)[0])"))
        if self.backing:
            out.append(("backingNeed", "variables.placement ? "
                                       "([0] + variables.initDid + variables.appDid).max() : 0"))
            before, after = BACKING_WARNING
            parts.append(f"[variables.backingNeed > 0 ? {q(before)} + "
                         f"string(variables.backingNeed) + {q(after)} : '']")
        vpa = (f"[variables.vpaSkip ? ({q(PROFILE_ANNOTATION)} in object.metadata.?"
               f"annotations.orValue({{}}) ? {cel_format(VPA_RAN_AFTER)} : "
               f"{cel_format(VPA_SKIP)}) : '']")
        every = f"({vpa} + (variables.vpaSkip ? [] : {' + '.join(parts)}))"
        limit = MAX_WARNING
        out.append(("msgs", f"{every}.filter(m, m != '').map(m, 'swapwise: ' + m)"
                            f".map(m, m.size() > {limit} ? m.substring(0, {limit - 3}) + '...'"
                            " : m)"))
        return out

    # -- the patch

    @staticmethod
    def _path(pointer: str, suffix: str) -> str:
        """CEL for the JSON Pointer of container ``i`` of a list, plus ``suffix``."""
        return f"'{pointer}/' + string(i) + {q(suffix)}"

    def resource_ops(self) -> list[str]:
        """Memory request (and, for defaultLimit and raiseLimit, limit) of changed containers."""
        p = self.p
        out = []
        default = format_bytes(p.default_limit) if p.default_limit is not None else ""
        empty = ("(c.?resources.?requests.orValue({}).size() == 0 && "
                 "c.?resources.?limits.orValue({}).size() == 0 && "
                 "c.?resources.?claims.orValue([]).size() == 0)")
        default_map = "{" + q("memory") + ": " + q(default) + "}"
        for kind, items, pointer in KINDS:
            v = f"variables.{kind}"
            new = f"{v}NewS[i]"

            def path(suffix: str, pointer: str = pointer) -> str:
                return self._path(pointer, suffix)

            whole = f"{{'requests': {{'memory': {new}}}, 'limits': {{'memory': {q(default)}}}}}"
            request = (
                f"{v}Mode[i] == 'target' ? {op('add', path('/resources/requests/memory'), new)}"
                f" : {empty} ? {op('add', path('/resources'), whole)}"
                f" : c.?resources.?requests.orValue({{}}).size() > 0"
                f" ? {op('add', path('/resources/requests/memory'), new)}"
                f" : {op('add', path('/resources/requests'), '{' + q('memory') + ': ' + new + '}')}"
            )
            out.append(f"{items}.transformList(i, c, {v}Chg[i] && {v}Mode[i] != 'vpa', {request})")
            limit = (
                f"{v}Mode[i] == 'vpa' ? {op('add', path('/resources/limits/memory'), new)}"
                f" : c.?resources.?limits.orValue({{}}).size() > 0"
                f" ? {op('add', path('/resources/limits/memory'), q(default))}"
                f" : {op('add', path('/resources/limits'), default_map)}"
            )
            out.append(f"{items}.transformList(i, c, {v}Chg[i] && ({v}Mode[i] == 'vpa' || "
                       f"({v}Mode[i] == 'default' && !{empty})), {limit})")
        return out

    def resize_ops(self) -> list[str]:
        """memory resizePolicy RestartContainer on changed regular containers and sidecars."""
        if self.p.resize_policy != RESTART:
            return []
        out = []
        entry = lit({"resourceName": "memory", "restartPolicy": RESTART})
        rp = "c.?resizePolicy.orValue([])"
        memory = f"{rp}.filter(e, e.resourceName == 'memory')"
        index = f"{rp}.transformList(j, e, e.resourceName == 'memory', j)[0]"
        for kind, items, pointer in KINDS:
            v = f"variables.{kind}"
            sidecar = " && c.?restartPolicy.orValue('') == 'Always'" if kind == "init" else ""
            replace = op("replace",
                         f"'{pointer}/' + string(i) + '/resizePolicy/' + string({index})"
                         " + '/restartPolicy'", q(RESTART))
            first = op("add", self._path(pointer, "/resizePolicy"), "[" + entry + "]")
            change = (f"{rp}.size() == 0 ? {first}"
                      f" : {memory}.size() == 0 ? "
                      f"{op('add', self._path(pointer, '/resizePolicy/-'), entry)} : {replace}")
            out.append(
                f"(object.spec.?restartPolicy.orValue('Always') == 'Never' ? [] : "
                f"{items}.transformList(i, c, {v}Chg[i]{sidecar} && ({memory}.size() == 0 || "
                f"{memory}[0].restartPolicy != {q(RESTART)}), {change}))"
            )
        return out

    def placement_ops(self) -> list[str]:
        """Node affinity into every required term (or one preferred term) and tolerations."""
        placement = self.p.placement
        if placement.mode == "none":
            return []
        wanted = [{"key": k, "operator": "In", "values": [v]} for k, v in placement.node_selector]
        out: list[str] = []
        base = "/spec/affinity/nodeAffinity"

        def lacks(expressions: str, w: dict[str, Any]) -> str:
            return (f"!{expressions}.exists(e, e.key == {q(w['key'])} && e.operator == 'In' && "
                    f"e.?values.orValue([]) == {lit(w['values'])})")

        if placement.mode == "required":  # the pressure entries at least, in every term
            out.append(self._required_ops(wanted, lacks))
        elif wanted:
            terms = f"{NODE_AFFINITY}.?{PREFERRED}.orValue([])"
            entry = {"weight": placement.weight, "preference": {"matchExpressions": wanted}}
            present = (f"{terms}.exists(pt, " + " && ".join(  # every wanted one is there
                lacks("pt.?preference.?matchExpressions.orValue([])", w).removeprefix("!")
                for w in wanted) + ")")
            out.append(
                f"({present} ? [] : {terms}.size() > 0 ? "
                f"[{op('add', q(base + '/' + PREFERRED + '/-'), lit(entry))}] : "
                f"{NODE_AFFINITY_SET} ? [{op('add', q(base + '/' + PREFERRED), lit([entry]))}] : "
                f"{AFFINITY_SET} ? [{op('add', q(base), lit({PREFERRED: [entry]}))}] : "
                f"[{op('add', q('/spec/affinity'), lit({'nodeAffinity': {PREFERRED: [entry]}}))}])"
            )
        tolerations = unique_tolerations(placement.tolerations)
        if tolerations:
            existing = "object.spec.?tolerations.orValue([])"
            each = [f"({existing}.exists(t, {cel_toleration_equal('t', tol)}) ? [] : "
                    f"[{op('add', q('/spec/tolerations/-'), lit(tol))}])" for tol in tolerations]
            out.append(f"({existing}.size() == 0 ? "
                       f"[{op('add', q('/spec/tolerations'), lit(tolerations))}] : "
                       f"{' + '.join(each)})")
        return out

    def need_variables(self) -> list[tuple[str, str]]:
        """The pod's swap-backing need (‰): the largest over the containers this pass
        changes, 0 when none does or backing does not apply (engine/mutate.py)."""
        if not self.backing:
            return []
        p = self.p
        out: list[tuple[str, str]] = []
        default = 0
        if p.default_limit is not None:
            request = target(p.default_limit, p)
            default = container_need(request, p.default_limit) if request < p.default_limit \
                else 0
        for kind, _, _ in KINDS:
            v = f"variables.{kind}"
            out.append((
                f"{kind}Need",
                f"{v}Mode.transformList(i, m, !{v}Chg[i] ? 0 : m == 'target' ? "
                f"{need_cel(f'{v}New[i]', f'{v}LimB[i]')} : m == 'default' ? {default} : "
                f"{need_cel(f'{v}LimB[i]', f'{v}New[i]')})"))
        out.append(("need", "variables.placement && variables.anyChg ? "
                            "([0] + variables.initNeed + variables.appNeed).max() : 0"))
        return out

    def _required_ops(self, wanted: list[dict[str, Any]], lacks: Any) -> str:
        """``wanted``, the pressure entries and the swap-backing entry into every
        required term (engine/placement.py ``_required_ops``; the ops come in another order,
        to the same pod)."""
        base = "/spec/affinity/nodeAffinity"
        terms = REQUIRED_TERMS
        pressures = pressure_expressions()
        expressions = lit([*wanted, *pressures])
        backing = ""
        if self.backing:
            sample = backing_expression(1)
            backing = ("{" + ", ".join(f"{q(k)}: dyn({lit(v)})" for k, v in sample.items()
                                       if k != "values")
                       + ", 'values': dyn([dyn(string(variables.need - 1))])}")
            expressions = f"({expressions} + (variables.need > 0 ? [dyn({backing})] : []))"
        new_terms = f"[dyn({{{q('matchExpressions')}: dyn({expressions})}})]"
        required = f"{{{q(REQUIRED)}: dyn({{{q('nodeSelectorTerms')}: dyn({new_terms})}})}}"
        def member(key: str, value: str) -> str:
            return f"{{{q(key)}: dyn({value})}}"

        chain = (
            f"!({AFFINITY_SET}) ? "
            f"[{op('add', q('/spec/affinity'), member('nodeAffinity', required))}]"
            f" : !({NODE_AFFINITY_SET}) ? [{op('add', q(base), required)}]"
            f" : !{NODE_AFFINITY}.?{REQUIRED}.?nodeSelectorTerms.hasValue() ? "
            f"[{op('add', q(base + '/' + REQUIRED), member('nodeSelectorTerms', new_terms))}]"
            f" : [{op('add', q(base + '/' + REQUIRED + '/nodeSelectorTerms'), new_terms)}]"
        )
        term_path = f"'{base}/{REQUIRED}/nodeSelectorTerms/' + string(j)"
        existing = "t.?matchExpressions.orValue([])"
        # a term without expressions gets all of them at once
        per_term = [f"{terms}.transformList(j, t, {existing}.size() == 0, "
                    f"{op('add', term_path + ' + ' + q('/matchExpressions'), expressions)})"]
        per_term += [f"{terms}.transformList(j, t, {existing}.size() > 0 && "
                     f"{lacks(existing, w)}, "
                     f"{op('add', term_path + ' + ' + q('/matchExpressions/-'), lit(w))})"
                     for w in wanted]
        # each pressure entry, unless the term has one with that key and operator already
        per_term += [
            f"{terms}.transformList(j, t, {existing}.size() > 0 && !{existing}.exists(e, "
            f"e.key == {q(pressure['key'])} && e.operator == {q(pressure['operator'])}), "
            f"{op('add', term_path + ' + ' + q('/matchExpressions/-'), lit(pressure))})"
            for pressure in pressures]
        if self.backing:
            # an earlier swapwise entry: Gt with one decimal-integer value; it implies ours
            # when its value is >= need - 1 (more than MAX_DIGITS significant digits: always)
            ours = (f"e.key == {q(PERMILLE_LABEL)} && e.operator == 'Gt' && "
                    "e.?values.orValue([]).size() == 1 && e.values[0].matches('^[0-9]+$')")
            implied = (f"{existing}.exists(e, {ours} && (e.values[0].matches("
                       f"'^0*[0-9]{{1,{MAX_DIGITS}}}$') ? int(e.values[0]) >= "
                       "variables.need - 1 : true))")
            first = f"{existing}.transformList(n, e, {ours}, n)"
            replace = op("replace", f"{term_path} + '/matchExpressions/' + string({first}[0])",
                         backing)
            append = op("add", term_path + " + " + q("/matchExpressions/-"), backing)
            per_term.append(
                f"{terms}.transformList(j, t, variables.need > 0 && {existing}.size() > 0 && "
                f"!{implied}, {first}.size() > 0 ? {replace} : {append})")
        # CEL: a ternary in a then-branch needs parentheses
        return f"({terms}.size() == 0 ? ({chain}) : {' + '.join(per_term)})"

    def patch_variables(self) -> list[tuple[str, str]]:
        p = self.p
        changes = " + ".join(self.resource_ops() + self.resize_ops()) or "[]"
        placement_ops = " + ".join(self.placement_ops()) or "[]"
        orig = f"object.metadata.?annotations[?{q(ORIGINAL_ANNOTATION)}]"
        entries = []
        for kind, items, _ in KINDS:
            v = f"variables.{kind}"
            entry = cel_entry("c.name", f"{v}Req[i]", f"{v}Lim[i]", f"{v}Mode[i] == 'default'")
            recorded = cel_has_entry(f"{orig}.orValue('')", "c.name")
            entries.append(f"{items}.transformList(i, c, {v}Chg[i] && !{recorded}, {entry})")
        old = f"{orig}.orValue('')"
        name = q(p.name)
        ann = "object.metadata.?annotations"
        profile_only = f"{{{q(PROFILE_ANNOTATION)}: {name}}}"
        with_orig = (f"{{{q(PROFILE_ANNOTATION)}: {name}, "
                     f"{q(ORIGINAL_ANNOTATION)}: variables.origJSON}}")
        both = f"variables.writeOrig ? {with_orig} : {profile_only}"
        write_orig = op("add", q("/metadata/annotations/swapwise.io~1original"),
                        "variables.origJSON")
        return [
            *self.need_variables(),
            ("core", f"variables.vpaSkip ? [] : {changes} + "
                     f"(variables.placement ? {placement_ops} : [])"),
            ("origEntries", " + ".join(entries)),
            ("origJSON", cel_merged(old, "variables.origEntries")),
            ("writeOrig", f"variables.anyChg && (!{orig}.hasValue() || "
                          "variables.origEntries.size() > 0)"),
            ("annOps",
             f"variables.core.size() == 0 ? [] : !has(object.metadata.annotations) ? "
             f"[{op('add', q('/metadata/annotations'), both)}] : "
             f"({ann}[?{q(PROFILE_ANNOTATION)}].orValue('') == {name} ? [] : "
             f"[{op('add', q('/metadata/annotations/swapwise.io~1profile'), name)}]) + "
             f"(variables.writeOrig ? [{write_orig}] : [])"),
        ]


# --------------------------------------------------------------------------- objects


def _targets(policy: Policy) -> list[Target]:
    overridden: dict[str, list[str]] = {}
    for profile, namespace in policy.overrides:
        overridden.setdefault(profile, []).append(namespace)
    out = []
    for name in sorted(policy.profiles):
        others = tuple(sorted(overridden.get(name, [])))
        out.append(Target(policy.profiles[name], None, others))
        out += [Target(policy.overrides[(name, ns)], ns) for ns in others]
    return out


def _namespace_selector(target_: Target, excluded: Sequence[str]) -> dict[str, Any]:
    expressions: list[dict[str, Any]] = [
        {"key": NAMESPACE_LABEL, "operator": "In", "values": [target_.profile.name]},
    ]
    if target_.namespace is not None:
        expressions.append({"key": NAME_LABEL, "operator": "In", "values": [target_.namespace]})
    else:
        skipped = sorted({*excluded, *target_.others})
        if skipped:
            expressions.append({"key": NAME_LABEL, "operator": "NotIn", "values": skipped})
    return {"matchExpressions": expressions}


def _variables(pairs: list[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"name": name, "expression": expression} for name, expression in pairs]


def render_target(
    target_: Target,
    api_version: str = "v1",
    failure_policy: str = "Ignore",
    excluded_namespaces: Sequence[str] = ALWAYS_EXCLUDED_NAMESPACES,
) -> list[dict[str, Any]]:
    """The four objects of one profile (or namespace override)."""
    cel = _Cel(target_.profile)
    group = "admissionregistration.k8s.io"
    rules = {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                "operations": ["CREATE"], "resources": ["pods"]}]}
    labels = {"app.kubernetes.io/managed-by": "swapwise",
              NAMESPACE_LABEL: target_.profile.name}
    selector = _namespace_selector(target_, excluded_namespaces)
    conditions = cel.match_conditions()
    shared = cel.variables()
    mutating = {
        "apiVersion": f"{group}/{api_version}",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": target_.name, "labels": labels},
        "spec": {
            "failurePolicy": failure_policy,
            "reinvocationPolicy": "IfNeeded",
            "matchConstraints": rules,
            "matchConditions": conditions,
            "variables": _variables(shared + cel.patch_variables()),
            "mutations": [{
                "patchType": "JSONPatch",
                "jsonPatch": {"expression": "(variables.core + variables.annOps).map(p, "
                                            "JSONPatch{op: p.op, path: p.path, value: p.value})"},
            }],
        },
    }
    mutating_binding = {
        "apiVersion": f"{group}/{api_version}",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": target_.name, "labels": labels},
        "spec": {"policyName": target_.name, "matchResources": {"namespaceSelector": selector}},
    }
    warn = f"{target_.name}-warn"
    slots = [{"expression": f"variables.msgs.size() <= {i}",
              "messageExpression": f"variables.msgs[{i}]"} for i in range(WARNING_SLOTS)]
    # the last slot: a 17th message itself, or how many more there are
    slots.append({"expression": f"variables.msgs.size() <= {WARNING_SLOTS}",
                  "messageExpression": f"variables.msgs.size() == {WARNING_SLOTS + 1} ? "
                                       f"variables.msgs[{WARNING_SLOTS}] : 'swapwise: ' + "
                                       f"string(variables.msgs.size() - {WARNING_SLOTS}) + "
                                       "' more warnings'"})
    validating = {
        "apiVersion": f"{group}/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": warn, "labels": labels},
        "spec": {
            "failurePolicy": failure_policy,
            "matchConstraints": rules,
            "matchConditions": conditions,
            "variables": _variables([*shared, *cel.warning_variables()]),
            "validations": slots,
        },
    }
    validating_binding = {
        "apiVersion": f"{group}/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": warn, "labels": labels},
        "spec": {"policyName": warn, "validationActions": ["Warn"],
                 "matchResources": {"namespaceSelector": selector}},
    }
    return [mutating, mutating_binding, validating, validating_binding]


def render_admission_policies(
    policy: Policy,
    api_version: str = "v1",
    failure_policy: str = "Ignore",
    excluded_namespaces: Sequence[str] = ALWAYS_EXCLUDED_NAMESPACES,
) -> list[dict[str, Any]]:
    """Every profile's policies and bindings; raises :class:`Unrenderable` (nothing
    rendered) when any profile cannot be expressed in CEL."""
    if api_version not in API_VERSIONS:
        raise ValueError(f"api_version must be one of {', '.join(API_VERSIONS)}")
    targets = _targets(policy)
    errors = [error for t in targets for error in check(t)]
    if errors:
        raise Unrenderable(errors)
    objects: list[dict[str, Any]] = []
    for t in targets:
        rendered = render_target(t, api_version, failure_policy, excluded_namespaces)
        errors += too_long(t, rendered)
        objects += rendered
    if errors:
        raise Unrenderable(errors)
    return objects


def _expressions(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(path, text) of every CEL expression in a rendered object."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expression", "messageExpression") and isinstance(value, str):
                yield f"{path}.{key}", value
            else:
                yield from _expressions(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _expressions(value, f"{path}[{index}]")


def too_long(target_: Target, objects: Sequence[dict[str, Any]]) -> list[str]:
    """An error per CEL expression the API server would refuse for its length."""
    errors = []
    where = f"profiles.{target_.profile.name}" if target_.namespace is None else \
        f"namespaces.{target_.namespace} (profile {target_.profile.name})"
    for obj in objects:
        for path, text in _expressions(obj.get("spec")):
            if len(text) > MAX_EXPRESSION_LENGTH:
                cause = (": its podSelector is too large; select on fewer label values" if
                         path.startswith(".matchConditions") else "")
                errors.append(
                    f"{where}: {obj['kind']} {obj['metadata']['name']} spec{path} would be "
                    f"{len(text):,} characters of CEL, over the {MAX_EXPRESSION_LENGTH:,} "
                    f"the API server accepts{cause}")
    return errors


HELM_MODE = "admissionPolicy"


def helm_values(objects: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The chart's values for ``mode: admissionPolicy``: the rendered objects as data.

    charts/swapwise installs ``admissionPolicy.objects`` as they are (adding its labels), so
    the rules stay here and nowhere in the chart's templates.
    """
    return {"mode": HELM_MODE, "admissionPolicy": {"objects": list(objects)}}
