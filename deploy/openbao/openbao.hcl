# OpenBao server for docker-compose.yml's `openbao` service: one node, Raft storage on the `openbao-data` volume.
#
# Plain HTTP: the listener is reachable only on the compose network (no port is published) and the hop to Lethe
# never leaves the host. Anything reachable beyond that (several hosts, Kubernetes) runs OpenBao with TLS and
# auto-unseal, from the official Helm chart (docs/erasure-at-rest.md, "Deployments").
#
# tests/keys/test_openbao_bootstrap.py runs this file against a real `bao server`, with the paths and addresses
# below rewritten to a temporary directory and loopback ports: keep each of them on its own line.

ui = false

storage "raft" {
  path    = "/openbao/file/raft"
  node_id = "openbao-0"
}

listener "tcp" {
  address         = "0.0.0.0:8200"
  cluster_address = "0.0.0.0:8201"
  tls_disable     = true
}

api_addr     = "http://openbao:8200"
cluster_addr = "http://openbao:8201"
