"""PKI of a hosted control plane (kubeadm's layout, made with the ``cryptography`` package).

Per cluster: a CA (ECDSA P-256, 10 years) that signs the kube-apiserver's serving certificate
(SANs: the endpoint's host names and addresses plus the in-cluster names of the ``kubernetes``
Service), the client certificates of the kube-controller-manager and kube-scheduler
(``system:kube-controller-manager`` / ``system:kube-scheduler``, which Kubernetes' default RBAC
binds) and of NVKE itself (``nvke:control-plane-manager`` in ``system:masters``: the break-glass
identity NVKE uses to mint tenant credentials, like kubeadm's ``super-admin.conf``; it is never
handed to a tenant) and of NVKE's metrics scraper (``system:monitoring``, which the default RBAC
allows ``/metrics``); a service-account signing key pair; and a secretbox key for Secrets at
rest. The datastore's certificates are the datastore's (:mod:`clusters.hosted.etcd`).
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import os
from dataclasses import asdict, dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
LEAF_DAYS = 365 * 3
#: the first address of kube-apiserver's ``--service-cluster-ip-range`` (the ``kubernetes``
#: Service's ClusterIP), which in-cluster clients dial
SERVICE_CIDR = "10.96.0.0/12"
KUBERNETES_SERVICE_IP = "10.96.0.1"
IN_CLUSTER_NAMES = (
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, both PEM text."""

    cert: str
    key: str


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def _certificate(
    *,
    subject: x509.Name,
    issuer: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    signer: ec.EllipticCurvePrivateKey,
    days: int,
    ca: bool,
    extensions: tuple[x509.ExtensionType, ...],
    now: datetime.datetime | None,
) -> KeyPair:
    """The one certificate builder: ``key``'s certificate for ``subject``, signed by ``signer``
    (``key`` itself for a self-signed CA), valid from five minutes before ``now`` for ``days``.
    Every certificate gets critical BasicConstraints and KeyUsage (digital signature; a ``ca``
    signs certificates and CRLs too), then ``extensions`` in order, not critical."""
    now = now or datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=ca,
                crl_sign=ca,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    for extension in extensions:
        builder = builder.add_extension(extension, critical=False)
    cert = builder.sign(signer, hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM).decode(), _pem_key(key))


def new_ca(common_name: str, *, now: datetime.datetime | None = None) -> KeyPair:
    """A self-signed CA certificate (``common_name``, 10 years) and its key."""
    key = _key()
    name = _name(common_name)
    return _certificate(
        subject=name,
        issuer=name,
        key=key,
        signer=key,
        days=CA_DAYS,
        ca=True,
        extensions=(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),),
        now=now,
    )


def issue(
    ca: KeyPair,
    common_name: str,
    *,
    organizations: tuple[str, ...] = (),
    server_names: tuple[str, ...] = (),
    client: bool = False,
    now: datetime.datetime | None = None,
) -> KeyPair:
    """A leaf certificate signed by ``ca``: a server certificate when ``server_names`` (DNS
    names and IP addresses, as text) are given, a client one when ``client``; both may be set."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert.encode())
    ca_key = serialization.load_pem_private_key(ca.key.encode(), password=None)
    usages = []
    if server_names:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    extensions: list[x509.ExtensionType] = [
        x509.ExtendedKeyUsage(usages),
        x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),
    ]
    if server_names:
        sans: list[x509.GeneralName] = []
        for name in server_names:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                sans.append(x509.DNSName(name))
        extensions.append(x509.SubjectAlternativeName(sans))
    return _certificate(
        subject=_name(common_name, organizations),
        issuer=ca_cert.subject,
        key=_key(),
        signer=ca_key,
        days=LEAF_DAYS,
        ca=False,
        extensions=tuple(extensions),
        now=now,
    )


@dataclass(frozen=True)
class ControlPlanePki:
    """Everything secret a hosted control plane needs, as PEM text (stored encrypted by NVKE,
    written to 0600 files by the control-plane manager).

    ``service_account_key``: RSA 2048 (kube-apiserver signs tokens with it, the
    controller-manager's token controller too); ``encryption_key``: 32 random bytes, base64 —
    the secretbox key of Secrets at rest."""

    ca: KeyPair
    apiserver: KeyPair
    controller_manager: KeyPair
    scheduler: KeyPair
    nvke_admin: KeyPair
    #: read-only scrape identity (group ``system:monitoring``: ``/metrics``, ``/livez`` ...)
    monitoring: KeyPair
    service_account_key: str
    service_account_pub: str
    encryption_key: str

    def to_dict(self) -> dict:
        """JSON-ready form (see :meth:`from_dict`)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ControlPlanePki:
        """The inverse of :meth:`to_dict`."""
        pairs = ("ca", "apiserver", "controller_manager", "scheduler", "nvke_admin", "monitoring")
        return cls(**{k: (KeyPair(**v) if k in pairs else v) for k, v in data.items()})


def new_service_account_keys() -> tuple[str, str]:
    """A key pair for signing service-account tokens (RSA 2048): (private key, PKCS#8 PEM;
    public key, SubjectPublicKeyInfo PEM) — kube-apiserver's ``--service-account-signing-key-file``
    and ``--service-account-key-file``."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return _pem_key(key), public.decode()


def new_control_plane_pki(cluster_name: str, server_names: tuple[str, ...]) -> ControlPlanePki:
    """A fresh PKI for one cluster; ``server_names`` are the endpoint's host names and IP
    addresses (``("127.0.0.1", "localhost")`` under ``make run``), to which the in-cluster
    names of the ``kubernetes`` Service are added."""
    ca = new_ca(f"nvke-{cluster_name}-ca")
    names = tuple(dict.fromkeys((*server_names, KUBERNETES_SERVICE_IP, *IN_CLUSTER_NAMES)))
    sa_key, sa_pub = new_service_account_keys()
    return ControlPlanePki(
        ca=ca,
        apiserver=issue(ca, "kube-apiserver", server_names=names),
        controller_manager=issue(ca, "system:kube-controller-manager", client=True),
        scheduler=issue(ca, "system:kube-scheduler", client=True),
        nvke_admin=issue(
            ca, "nvke:control-plane-manager", organizations=("system:masters",), client=True
        ),
        monitoring=issue(ca, "nvke:monitoring", organizations=("system:monitoring",), client=True),
        service_account_key=sa_key,
        service_account_pub=sa_pub,
        encryption_key=base64.b64encode(os.urandom(32)).decode(),
    )


def encryption_config(key_b64: str) -> str:
    """kube-apiserver's ``--encryption-provider-config``: Secrets sealed with secretbox
    (XSalsa20-Poly1305) under the cluster's own key; ``identity`` last so that Secrets written
    before encryption was on can still be read."""
    return (
        "apiVersion: apiserver.config.k8s.io/v1\n"
        "kind: EncryptionConfiguration\n"
        "resources:\n"
        "- resources: [secrets]\n"
        "  providers:\n"
        "  - secretbox:\n"
        "      keys:\n"
        "      - name: key1\n"
        f"        secret: {key_b64}\n"
        "  - identity: {}\n"
    )


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def kubeconfig(
    *,
    name: str,
    server: str,
    ca_cert: str,
    token: str | None = None,
    client: KeyPair | None = None,
) -> str:
    """A kubeconfig (YAML text) for ``server`` trusting ``ca_cert``, authenticating with a
    bearer ``token`` or a ``client`` certificate (exactly one)."""
    if (token is None) == (client is None):
        raise ValueError("give exactly one of token and client")
    user = (
        f"    token: {token}\n"
        if token is not None
        else f"    client-certificate-data: {_b64(client.cert)}\n"
        f"    client-key-data: {_b64(client.key)}\n"
    )
    return (
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: {name}\n  cluster:\n    server: {server}\n"
        f"    certificate-authority-data: {_b64(ca_cert)}\n"
        f"contexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: {name}\n"
        f"current-context: {name}\n"
        f"users:\n- name: {name}\n  user:\n{user}"
    )
