"""Keys: content encrypted at rest, and the keys a forget destroys (docs/erasure-at-rest.md).

Used only by repositories, through one object, `content.Sealer`, which the container builds and services carry.
Content becomes AES-256-GCM ciphertext (`envelope`) under the data key of a leaf, one erasure unit's number
(`leaves`). A leaf's key is derived from its shard's cover (`tree`), which lives in a key provider outside
PostgreSQL (`provider`: `local` files or an `openbao` / `vault` KV engine); `keyring` derives, caches (`cache`) and
shreds: a forget punctures its leaves in the cover, so no copy of the database (WAL, replicas, backups) can be
decrypted for them, while every other leaf keeps its key.
"""
