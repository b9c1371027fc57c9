path "secret/data/lethe/*"     { capabilities = ["create", "read", "update"] }
path "secret/metadata/lethe/*" { capabilities = ["read"] }
path "secret/destroy/lethe/*"  { capabilities = ["update"] }
