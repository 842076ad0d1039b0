"""Hosted control planes: NVKE runs each tenant cluster's kube-apiserver, controller-manager
and scheduler itself, on one shared etcd (docs/concepts/hosted-control-planes.md).

``pki`` (certificates and keys), ``etcd`` (the shared datastore), ``processes`` (files and
command lines), ``binaries`` (where the builder put them), ``manager`` (the one owner of the
processes), ``status`` (what the manager writes back).
"""
