"""The ``hosted`` provider: NVKE runs each cluster's control plane itself (Kamaji's model).

Control plane: real kube-apiserver, kube-controller-manager and kube-scheduler at the
cluster's minor, on a shared etcd with a per-cluster prefix and credential
(:mod:`clusters.hosted`). This class, called by the cluster reconciler in a Celery worker, only
writes the desired state (a :class:`clusters.models.HostedControlPlane` row with its PKI and
port) and reads back what the control-plane manager observed; it never starts or signals a
process, so killing a worker never touches an apiserver.

Machines: SIMULATED hosts, exactly as the ``simulated`` provider places and boots them (its
methods are inherited); their kubelets are the cluster's KWOK, and their Nodes are written by
:meth:`HostedProvider.sync_nodes` from the hosts' observed truth (:mod:`nodepools.tenant_nodes`).

GPU add-ons: the pools' rendered GPU Operator inputs and ComputeDomains, with their upstream
CRDs, applied by :meth:`HostedProvider.sync_addons` (:mod:`clusters.hosted.addons`) from the
same render as the ``clusterapi`` provider's. Nothing runs the GPU Operator here: the objects
are accepted and stored by the real API; the simulated hosts act on NVKE's desired state.

Tenant credentials: a ServiceAccount ``nvke-system/tenant-admin`` bound to ``cluster-admin``
by the ClusterRoleBinding ``nvke:tenant-admin`` (RBAC, not ``system:masters``: revocable), with
a service-account token Secret per issued kubeconfig. A new kubeconfig deletes the previous
Secret, and kube-apiserver refuses a token whose Secret is gone (401) at once, without a
restart. NVKE mints them with its own client certificate (``system:masters``), never handed out.
"""

from __future__ import annotations

import base64
import json
import socket
import time
import uuid
from datetime import datetime, timedelta

import urllib3
from django.conf import settings
from django.db import IntegrityError, transaction

from nvke import crypto

from ..hosted import binaries
from ..hosted import pki as pki_lib
from .base import (
    ClusterSpec,
    ControlPlaneStatus,
    DeletionStatus,
    Evictions,
    NodePoolSpec,
    NodeSpec,
    ProviderError,
    TenantNode,
    api_refusals,
)
from .simulated import SimulatedProvider

#: the endpoint's names in the serving certificate (kube-apiserver listens on 127.0.0.1)
ENDPOINT_NAMES = ("127.0.0.1", "localhost")
ADMIN_NAMESPACE = "nvke-system"
ADMIN_ACCOUNT = "tenant-admin"
ADMIN_BINDING = "nvke:tenant-admin"
CREDENTIAL_LABEL = "nvke.dev/credential"
TOKEN_WAIT_S = 20.0
#: a row no manager has looked at for this long gets a message that says so
MANAGER_SILENT_S = 30.0


def port_range() -> range:
    """``NVKE_HOSTED_PORT_RANGE`` ("16400-16999") as a range."""
    first, last = settings.NVKE_HOSTED_PORT_RANGE.split("-")
    return range(int(first), int(last) + 1)


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def endpoint(port: int) -> str:
    return f"https://127.0.0.1:{port}"


class HostedProvider(SimulatedProvider):
    name = "hosted"
    publishes_nodes = True
    applies_addons = True

    # ---------------------------------------------------------------- control plane
    def kubernetes_minors(self) -> tuple[str, ...]:
        """The minors NVKE builds control-plane binaries of
        (:func:`clusters.hosted.binaries.kubernetes_minors`)."""
        return binaries.kubernetes_minors()

    def ensure_control_plane(self, cluster: ClusterSpec, now: datetime) -> ControlPlaneStatus:
        """Raises a non-retryable ProviderError ``unsupported_kubernetes_version`` for a
        version NVKE builds no binaries of (the API refuses it; a cluster that asked for it
        before, or whose minor the operator removed from ``deploy/k8s``, gets here), unless
        its control plane already runs it, ready: it keeps serving."""
        from ..models import HostedControlPlane

        row = HostedControlPlane.objects.filter(pk=cluster.id).first()
        minors = self.kubernetes_minors()
        minor = binaries.target_of(cluster.kubernetes_version)[1:]
        serving = row is not None and row.ready and row.version == cluster.kubernetes_version
        if minor not in minors and not serving:
            raise ProviderError(
                f"NVKE builds no Kubernetes binaries for {minor}: hosted control planes run "
                f"{', '.join(minors) or 'none'}",
                retryable=False,
                code="unsupported_kubernetes_version",
            )
        if row is None:
            row = self._create(cluster)
            return ControlPlaneStatus(
                ready=False,
                message="control plane requested; waiting for the control-plane manager",
                retry_after_s=1.0,
            )
        if row.version != cluster.kubernetes_version:
            # an upgrade (one minor, checked by the API): same etcd prefix, new binaries
            HostedControlPlane.objects.filter(pk=row.pk).update(
                version=cluster.kubernetes_version,
                ready=False,
                state=HostedControlPlane.State.STARTING,
                message=f"upgrade to Kubernetes {cluster.kubernetes_version} requested",
            )
            return ControlPlaneStatus(
                ready=False,
                message=f"upgrading the control plane to {cluster.kubernetes_version}",
                retry_after_s=1.0,
            )
        same_minor = row.running_version.split(".")[:2] == row.version.split(".")[:2]
        if row.ready and same_minor:
            return ControlPlaneStatus(
                ready=True, endpoint=endpoint(row.port), version=row.running_version
            )
        message = row.message or "waiting for the control-plane manager"
        if row.observed_at is None and now - row.created_at > timedelta(seconds=MANAGER_SILENT_S):
            message = (
                "no control-plane manager has picked this control plane up "
                f"for {(now - row.created_at).total_seconds():.0f} s "
                "(is `manage.py run_control_planes` running?)"
            )
        return ControlPlaneStatus(ready=False, message=message, retry_after_s=1.0)

    def _create(self, cluster: ClusterSpec):
        from ..models import HostedControlPlane

        bundle = pki_lib.new_control_plane_pki(cluster.name, ENDPOINT_NAMES)
        secret = crypto.encrypt(json.dumps(bundle.to_dict()))
        taken = set(HostedControlPlane.objects.values_list("port", flat=True))
        for port in port_range():
            if port in taken or not _bindable(port):
                continue
            try:
                with transaction.atomic():
                    return HostedControlPlane.objects.create(
                        cluster_id=cluster.id,
                        version=cluster.kubernetes_version,
                        port=port,
                        pki_encrypted=secret,
                        ca_cert=bundle.ca.cert,
                    )
            except IntegrityError:
                continue  # another cluster took that port meanwhile
        raise ProviderError(
            f"no free port left in NVKE_HOSTED_PORT_RANGE={settings.NVKE_HOSTED_PORT_RANGE}",
            code="no_free_port",
        )

    def delete_control_plane(self, cluster: ClusterSpec) -> DeletionStatus:
        from ..models import HostedControlPlane

        row = HostedControlPlane.objects.filter(pk=cluster.id).first()
        if row is None:
            return DeletionStatus(gone=True)
        if row.state == HostedControlPlane.State.DELETED:
            row.delete()  # its PKI goes with it
            return DeletionStatus(gone=True)
        if row.desired != HostedControlPlane.Desired.DELETED:
            HostedControlPlane.objects.filter(pk=row.pk).update(
                desired=HostedControlPlane.Desired.DELETED
            )
        return DeletionStatus(
            gone=False,
            leftovers=(
                f"kube-apiserver on 127.0.0.1:{row.port}",
                f"etcd prefix /nvke/{cluster.id}/",
            ),
            message="waiting for the control-plane manager to stop the control plane",
        )

    # ---------------------------------------------------------------- nodes
    def sync_nodes(self, cluster: ClusterSpec, nodes: list[TenantNode]) -> None:
        """The cluster's API holds exactly ``nodes`` among NVKE's Nodes; its KWOK keeps them
        alive (:mod:`clusters.hosted.nodes`). Then the ResourceSlices of the DRA pools' nodes
        and their DeviceClass (:mod:`clusters.hosted.dra`): a node's slice is written after
        the node, and deleted before it. The slices are not even listed while no node given
        publishes DRA devices and no Node in the API carries :data:`~.base.DRA_NODE_LABEL`
        (then none of NVKE's can exist)."""
        from ..hosted import dra as hosted_dra
        from ..hosted import nodes as hosted_nodes

        nodes_refused = "the cluster's API refused NVKE's Nodes"
        slices_refused = "the cluster's API refused NVKE's ResourceSlices"

        def sync(api) -> None:
            with api_refusals(nodes_refused):
                existing = hosted_nodes.existing(api)
            with api_refusals(slices_refused):
                kept = hosted_dra.prune(api, nodes, existing)
            with api_refusals(nodes_refused):
                hosted_nodes.sync(api, nodes, existing)
            with api_refusals(slices_refused):
                hosted_dra.publish(api, nodes, kept)

        self._on_api(cluster, sync)

    def sync_addons(self, cluster: ClusterSpec, pools: list[NodePoolSpec]) -> dict[uuid.UUID, str]:
        """The pools' GPU Operator objects and ComputeDomains, with their CRDs, in the
        cluster's API (:mod:`clusters.hosted.addons`); the API's refusals by pool id."""
        from ..hosted import addons
        from .clusterapi.client import ApiError, KubeApi

        _, api = self._admin_client(cluster)
        try:
            return addons.sync(KubeApi(api, name="cluster's API"), pools)
        except ApiError as exc:  # no answer, 409, 429, 5xx: try again
            raise ProviderError(str(exc), code="cluster_api_error") from exc
        finally:
            api.close()

    # ---------------------------------------------------------------- disruption
    def cordon_node(self, pool: NodePoolSpec, node: NodeSpec) -> None:
        """``spec.unschedulable: true`` on the node's Node (none yet: nothing to cordon)."""
        from ..hosted import drain

        self._on_api(pool.cluster, lambda api: drain.cordon(api, node.name))

    def evict_pods(self, pool: NodePoolSpec, node: NodeSpec, *, force: bool) -> Evictions:
        """The node's pods asked to leave through the Eviction API, honouring their
        PodDisruptionBudgets (``force``: deleted instead): :mod:`clusters.hosted.drain`."""
        from ..hosted import drain

        return self._on_api(pool.cluster, lambda api: drain.evict_pods(api, node.name, force=force))

    def pod_annotations(self, pool: NodePoolSpec, node: NodeSpec, key: str) -> dict[str, str]:
        """Annotation ``key`` of the pods bound to the node, read from the tenant's API."""
        from ..hosted import drain

        return self._on_api(pool.cluster, lambda api: drain.pod_annotations(api, node.name, key))

    def drain_blockers(self, pool: NodePoolSpec, node: NodeSpec) -> list[str]:
        """The pods kube-apiserver would refuse to evict now (a dry-run eviction of each)."""
        from ..hosted import drain

        return self._on_api(
            pool.cluster,
            lambda api: drain.evict_pods(api, node.name, force=False, dry_run=True).remaining,
        )

    def _on_api(self, cluster: ClusterSpec, call, refused: str = "the cluster's API refused"):
        """``call(api)`` with NVKE's client of the cluster's API; the API's refusals
        (``"<refused> (<status> <reason>)"``) and silences as retryable :class:`ProviderError`."""
        from kubernetes.client.rest import ApiException

        _, api = self._admin_client(cluster)
        try:
            return call(api)
        except ApiException as exc:
            raise ProviderError(
                f"{refused} ({exc.status} {exc.reason})", code="cluster_api_error"
            ) from exc
        except (OSError, urllib3.exceptions.HTTPError) as exc:  # the apiserver restarting
            raise ProviderError(
                f"the cluster's API did not answer ({exc})", code="cluster_api_error"
            ) from exc
        finally:
            api.close()

    # ---------------------------------------------------------------- credentials
    def kubeconfig(self, cluster: ClusterSpec) -> str:
        """A kubeconfig for the tenant admin with a NEW token; the previous one is revoked
        (its Secret deleted: kube-apiserver answers 401 to it from then on)."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        row, api = self._admin_client(cluster)
        core = client.CoreV1Api(api)
        rbac = client.RbacAuthorizationV1Api(api)
        try:
            _create_ignoring_conflict(
                core.create_namespace, client.V1Namespace(metadata={"name": ADMIN_NAMESPACE})
            )
            _create_ignoring_conflict(
                core.create_namespaced_service_account,
                ADMIN_NAMESPACE,
                client.V1ServiceAccount(metadata={"name": ADMIN_ACCOUNT}),
            )
            _create_ignoring_conflict(
                rbac.create_cluster_role_binding,
                client.V1ClusterRoleBinding(
                    metadata={"name": ADMIN_BINDING},
                    role_ref=client.V1RoleRef(
                        api_group="rbac.authorization.k8s.io",
                        kind="ClusterRole",
                        name="cluster-admin",
                    ),
                    subjects=[
                        client.RbacV1Subject(
                            kind="ServiceAccount", name=ADMIN_ACCOUNT, namespace=ADMIN_NAMESPACE
                        )
                    ],
                ),
            )
            core.delete_collection_namespaced_secret(
                ADMIN_NAMESPACE, label_selector=f"{CREDENTIAL_LABEL}={ADMIN_ACCOUNT}"
            )
            secret = core.create_namespaced_secret(
                ADMIN_NAMESPACE,
                client.V1Secret(
                    metadata={
                        "generateName": f"{ADMIN_ACCOUNT}-token-",
                        "labels": {CREDENTIAL_LABEL: ADMIN_ACCOUNT},
                        "annotations": {"kubernetes.io/service-account.name": ADMIN_ACCOUNT},
                    },
                    type="kubernetes.io/service-account-token",
                ),
            )
            deadline = time.monotonic() + TOKEN_WAIT_S
            token = ""
            while not token:
                data = core.read_namespaced_secret(secret.metadata.name, ADMIN_NAMESPACE).data
                token = base64.b64decode((data or {}).get("token", "")).decode()
                if not token:
                    if time.monotonic() > deadline:
                        raise ProviderError(
                            "the cluster's controller-manager has not issued the admin token "
                            f"within {TOKEN_WAIT_S:.0f} s",
                            code="credentials_not_ready",
                        )
                    time.sleep(0.2)
        except ApiException as exc:
            raise ProviderError(
                f"the cluster's API refused NVKE ({exc.status} {exc.reason})",
                code="cluster_api_error",
            ) from exc
        finally:
            api.close()
        return pki_lib.kubeconfig(
            name=cluster.name, server=endpoint(row.port), ca_cert=row.ca_cert, token=token
        )

    def _admin_client(self, cluster: ClusterSpec):
        """(the row, a ``kubernetes`` ApiClient authenticated as NVKE itself)."""
        import yaml
        from kubernetes import config

        from ..models import HostedControlPlane

        row = HostedControlPlane.objects.filter(pk=cluster.id).first()
        if row is None:
            raise ProviderError("the control plane does not exist", code="control_plane_missing")
        bundle = pki_lib.ControlPlanePki.from_dict(json.loads(crypto.decrypt(row.pki_encrypted)))
        text = pki_lib.kubeconfig(
            name=cluster.name,
            server=endpoint(row.port),
            ca_cert=row.ca_cert,
            client=bundle.nvke_admin,
        )
        return row, config.new_client_from_config_dict(yaml.safe_load(text))


def _create_ignoring_conflict(create, *args) -> None:
    from kubernetes.client.rest import ApiException

    try:
        create(*args)
    except ApiException as exc:
        if exc.status != 409:
            raise
