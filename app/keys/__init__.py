"""Keys: envelope encryption of content and the keys a forget destroys (docs/erasure-at-rest.md).

Used only by repositories: content becomes ciphertext (`envelope`) under a data key; data keys are wrapped by the
tenant's epoch key, and epoch keys by a root version that lives in a key provider outside PostgreSQL (`provider`,
`local`, `openbao`). `keyring` issues and reads keys through a `cache`; `shredder` retires epoch keys and root
versions so that copies of forgotten keys (WAL, replicas, backups) become noise.
"""
