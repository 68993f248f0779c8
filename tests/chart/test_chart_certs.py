"""certs.mode: selfSigned, certManager, secret; and the certificate names for webhook.url."""

from __future__ import annotations

import base64
import ipaddress
from typing import Any

import pytest
from chartlib import CHART, NAMESPACE, RELEASE, Chart, all_of, one, webhooks
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import padding, rsa

FULL = f"{RELEASE}-swapwise"
SERVICE_NAMES = [
    FULL,
    f"{FULL}.{NAMESPACE}",
    f"{FULL}.{NAMESPACE}.svc",
    f"{FULL}.{NAMESPACE}.svc.cluster.local",
]


def _cert(b64: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(base64.b64decode(b64))


def _tls_volume(objs: list[dict[str, Any]]) -> dict[str, Any]:
    spec = one(objs, "Deployment")["spec"]["template"]["spec"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "tls"]
    (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "tls"]
    assert mount == {"name": "tls", "mountPath": "/etc/swapwise/tls", "readOnly": True}
    return dict(volume["secret"])


def _verify_signed_by(cert: x509.Certificate, ca: x509.Certificate) -> None:
    key = ca.public_key()
    assert isinstance(key, rsa.RSAPublicKey)
    assert cert.signature_hash_algorithm is not None
    key.verify(
        cert.signature,
        cert.tbs_certificate_bytes,
        padding.PKCS1v15(),
        cert.signature_hash_algorithm,
    )


# ---- selfSigned -----------------------------------------------------------------------


def test_self_signed_is_a_new_ca_on_every_render_and_the_readme_tells_gitops_users(
        chart: Chart) -> None:
    """Where Helm cannot read the Secret back (`helm template`, as Argo CD renders), each
    render makes a new CA: each GitOps sync would rotate every caBundle. The chart README
    says so where certificate modes are chosen, and what to use instead (issue 46)."""
    first, second = (one(chart.render(), "Secret")["data"]["ca.crt"] for _ in range(2))
    assert first != second
    text = " ".join((CHART / "README.md").read_text().split())
    section = text[text.index("## Certificates"):]
    section = section[:section.index("## ", 3)]
    assert "GitOps (Argo CD, Flux): do not use `selfSigned`." in section
    assert "every render makes a new CA" in section
    assert "Use `certs.mode: certManager`" in section and "or `certs.mode: secret`" in section



def test_self_signed_secret_and_ca_bundle(chart: Chart) -> None:
    objs = chart.render({"policy": {"profiles": {"a": {}, "b": {}}}})
    secret = one(objs, "Secret")
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"]["name"] == f"{FULL}-tls"
    assert set(secret["data"]) == {"ca.crt", "tls.crt", "tls.key"}
    # Every entry trusts exactly the CA stored in the Secret.
    for entry in webhooks(objs):
        assert entry["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    assert _tls_volume(objs)["secretName"] == f"{FULL}-tls"


def test_self_signed_certificate_names_and_chain(chart: Chart) -> None:
    secret = one(chart.render(), "Secret")
    ca, cert = _cert(secret["data"]["ca.crt"]), _cert(secret["data"]["tls.crt"])
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(san.get_values_for_type(x509.DNSName)) == sorted(SERVICE_NAMES)
    assert cert.issuer == ca.subject
    _verify_signed_by(cert, ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    key = base64.b64decode(secret["data"]["tls.key"])
    assert b"PRIVATE KEY" in key


def test_self_signed_validity_days(chart: Chart) -> None:
    secret = one(chart.render({"certs": {"selfSigned": {"validityDays": 30}}}), "Secret")
    cert = _cert(secret["data"]["tls.crt"])
    days = (cert.not_valid_after_utc - cert.not_valid_before_utc).days
    assert 29 <= days <= 31


@pytest.mark.parametrize(
    ("url", "ips", "dns"),
    [
        ("https://127.0.0.1:8443", ["127.0.0.1"], []),
        ("https://[::1]:8443", ["::1"], []),
        ("https://webhook.example.test:9443/base", [], ["webhook.example.test"]),
    ],
)
def test_self_signed_certificate_names_the_url_host(
    chart: Chart, url: str, ips: list[str], dns: list[str]
) -> None:
    secret = one(chart.render({"webhook": {"url": url}}), "Secret")
    cert = _cert(secret["data"]["tls.crt"])
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address(i) for i in ips]
    assert san.get_values_for_type(x509.DNSName) == dns


# ---- certManager ----------------------------------------------------------------------


def test_cert_manager_chain(chart: Chart) -> None:
    objs = chart.render({"certs": {"mode": "certManager"}})
    assert not all_of(objs, "Secret")
    issuers = {o["metadata"]["name"]: o for o in all_of(objs, "Issuer")}
    certs = {o["metadata"]["name"]: o for o in all_of(objs, "Certificate")}
    assert set(issuers) == {f"{FULL}-selfsigned", f"{FULL}-ca"}
    assert set(certs) == {f"{FULL}-ca", f"{FULL}-serving"}
    for obj in [*issuers.values(), *certs.values()]:
        assert obj["apiVersion"] == "cert-manager.io/v1"
        assert obj["metadata"]["namespace"] == NAMESPACE

    assert issuers[f"{FULL}-selfsigned"]["spec"] == {"selfSigned": {}}
    ca_cert = certs[f"{FULL}-ca"]["spec"]
    assert ca_cert["isCA"] is True
    assert ca_cert["issuerRef"] == {
        "name": f"{FULL}-selfsigned",
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    assert issuers[f"{FULL}-ca"]["spec"] == {"ca": {"secretName": ca_cert["secretName"]}}

    serving = certs[f"{FULL}-serving"]["spec"]
    assert serving["issuerRef"]["name"] == f"{FULL}-ca"
    assert serving["secretName"] == f"{FULL}-tls"
    assert serving["dnsNames"] == SERVICE_NAMES
    assert "server auth" in serving["usages"]
    assert serving["duration"] == "2160h" and serving["renewBefore"] == "720h"

    mwc = one(objs, "MutatingWebhookConfiguration")
    assert mwc["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{NAMESPACE}/{FULL}-serving"
    }
    for entry in mwc["webhooks"]:
        assert "caBundle" not in entry["clientConfig"]  # cert-manager injects it
    assert _tls_volume(objs)["secretName"] == f"{FULL}-tls"


def test_cert_manager_with_url_names_the_ip(chart: Chart) -> None:
    values = {"certs": {"mode": "certManager"}, "webhook": {"url": "https://127.0.0.1:8443"}}
    serving = one(chart.render(values), "Certificate", f"{FULL}-serving")["spec"]
    assert serving["ipAddresses"] == ["127.0.0.1"]
    assert "dnsNames" not in serving


# ---- secret ---------------------------------------------------------------------------

PEM = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"


@pytest.mark.parametrize(
    "given", [PEM, base64.b64encode(PEM.encode()).decode()], ids=["pem", "base64"]
)
def test_existing_secret(chart: Chart, given: str) -> None:
    values = {"certs": {"mode": "secret", "secretName": "my-tls", "caBundle": given}}
    objs = chart.render(values)
    assert not all_of(objs, "Secret")
    assert not all_of(objs, "Certificate")
    for entry in webhooks(objs):
        assert base64.b64decode(entry["clientConfig"]["caBundle"]).decode() == PEM
    assert "annotations" not in one(objs, "MutatingWebhookConfiguration")["metadata"]
    assert _tls_volume(objs)["secretName"] == "my-tls"


@pytest.mark.parametrize(
    "certs",
    [
        {"mode": "secret"},
        {"mode": "secret", "secretName": "x"},
        {"mode": "secret", "caBundle": PEM},
    ],
    ids=["neither", "no-ca", "no-name"],
)
def test_existing_secret_needs_name_and_ca(chart: Chart, certs: dict[str, str]) -> None:
    err = chart.error({"certs": certs})
    assert "/certs/" in err and ("secretName" in err or "caBundle" in err)
