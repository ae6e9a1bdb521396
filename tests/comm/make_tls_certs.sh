#!/usr/bin/env bash
# Makes the certificates of the TLS rendezvous tests in DIR with the openssl command:
#   ca.pem                     the job's CA (the trust anchor of every process)
#   node.pem, node.key         a certificate the CA signed, for the scheduler and workers
#   rogue_ca.pem               another CA
#   rogue.pem, rogue.key       a certificate the other CA signed: refused by the job
# EC keys on prime256v1 (quick to make), valid for 2 days. The leaf certificates may
# serve both ends of a connection (extendedKeyUsage serverAuth, clientAuth); host names
# are not checked, the CA is what a process trusts.
#
#   make_tls_certs.sh DIR
set -eu
dir=$1
mkdir -p "$dir"
cd "$dir"
cat > leaf.ext <<'END'
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
END
# make_ca NAME: NAME.pem, NAME.key, self-signed.
make_ca() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj "/CN=tessera test $1" -keyout "$1.key" -out "$1.pem" \
    -addext "basicConstraints = critical, CA:TRUE" -addext "keyUsage = critical, keyCertSign, cRLSign" 2>/dev/null
}
# make_leaf NAME CA: NAME.pem, NAME.key, signed by CA.
make_leaf() {
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -subj "/CN=tessera test $1" -keyout "$1.key" -out "$1.csr" 2>/dev/null
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -set_serial "0x$(openssl rand -hex 8)" -days 2 \
    -extfile leaf.ext -out "$1.pem" 2>/dev/null
  rm -f "$1.csr"
}
make_ca ca
make_leaf node ca
make_ca rogue_ca
make_leaf rogue rogue_ca
openssl verify -CAfile ca.pem node.pem >/dev/null
echo "make_tls_certs.sh: certificates in $PWD"
