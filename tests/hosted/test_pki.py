"""The PKI of a hosted control plane (no processes): read back with ``cryptography`` itself."""

from __future__ import annotations

import base64
import ipaddress

import pytest
import yaml
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from clusters.hosted.pki import (
    ControlPlanePki,
    encryption_config,
    kubeconfig,
    new_control_plane_pki,
)


def _cert(pem: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem.encode())


def test_each_cluster_gets_its_own_ca_and_a_serving_certificate_for_its_endpoint() -> None:
    a = new_control_plane_pki("alpha", ("127.0.0.1", "localhost"))
    b = new_control_plane_pki("beta", ("127.0.0.1", "localhost"))
    assert a.ca.cert != b.ca.cert

    ca, serving = _cert(a.ca.cert), _cert(a.apiserver.cert)
    serving.verify_directly_issued_by(ca)  # raises if not signed by this cluster's CA
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    assert {"localhost", "kubernetes.default.svc"} <= set(sans.get_values_for_type(x509.DNSName))
    usage = serving.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    with pytest.raises((InvalidSignature, ValueError)):  # another cluster's CA did not sign it
        serving.verify_directly_issued_by(_cert(b.ca.cert))


def test_component_identities_are_the_ones_kubernetes_rbac_binds() -> None:
    bundle = new_control_plane_pki("alpha", ("127.0.0.1",))

    def subject(pem: str) -> tuple[str, list[str]]:
        name = _cert(pem).subject
        cn = name.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
        return cn, [a.value for a in name.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]

    assert subject(bundle.controller_manager.cert) == ("system:kube-controller-manager", [])
    assert subject(bundle.scheduler.cert) == ("system:kube-scheduler", [])
    assert subject(bundle.nvke_admin.cert) == ("nvke:control-plane-manager", ["system:masters"])
    assert subject(bundle.monitoring.cert) == ("nvke:monitoring", ["system:monitoring"])
    for pair in (bundle.controller_manager, bundle.scheduler, bundle.nvke_admin, bundle.monitoring):
        usage = _cert(pair.cert).extensions.get_extension_for_class(x509.ExtendedKeyUsage)
        assert list(usage.value) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert isinstance(_cert(bundle.ca.cert).public_key(), ec.EllipticCurvePublicKey)


def test_the_bundle_round_trips_and_the_encryption_key_is_32_bytes() -> None:
    bundle = new_control_plane_pki("alpha", ("127.0.0.1",))
    assert ControlPlanePki.from_dict(bundle.to_dict()) == bundle
    assert len(base64.b64decode(bundle.encryption_key)) == 32
    config = yaml.safe_load(encryption_config(bundle.encryption_key))
    providers = config["resources"][0]["providers"]
    assert config["resources"][0]["resources"] == ["secrets"]
    assert providers[0]["secretbox"]["keys"][0]["secret"] == bundle.encryption_key
    assert providers[-1] == {"identity": {}}  # Secrets written before encryption stay readable


def test_a_kubeconfig_takes_a_token_or_a_client_certificate() -> None:
    bundle = new_control_plane_pki("alpha", ("127.0.0.1",))
    text = kubeconfig(
        name="alpha", server="https://127.0.0.1:16400", ca_cert=bundle.ca.cert, token="t0k"
    )
    config = yaml.safe_load(text)
    assert config["users"][0]["user"] == {"token": "t0k"}
    ca = base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"])
    assert ca.decode() == bundle.ca.cert
    with pytest.raises(ValueError, match="exactly one"):
        kubeconfig(name="x", server="https://h", ca_cert=bundle.ca.cert)
