# shellcheck shell=bash
# A throwaway certificate authority for cases that run the stack over TLS (sourced by a
# case). Needs the openssl CLI.
#
#   tls_make DIR   DIR/ca.pem: a new CA's certificate (its key DIR/ca.key);
#                  DIR/cert.pem: a certificate it signed for 127.0.0.1, ::1 and localhost,
#                  then the CA's (the chain denv-cp serves), its key DIR/key.pem;
#                  TLS_EXTRA_SAN (e.g. IP:10.231.0.1) adds names to it;
#                  DIR/other-ca.pem: another CA, which signed nothing here

tls_make() {
  local d="$1" tag; tag="$(basename "$d")-$$"
  mkdir -p "$d"
  local ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
  openssl req -x509 "${ec[@]}" -days 2 -subj "/CN=denv e2e CA $tag" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    -keyout "$d/ca.key" -out "$d/ca.pem" 2>/dev/null || { echo "tls_make: openssl could not make the CA"; return 1; }
  openssl req -x509 "${ec[@]}" -days 2 -subj "/CN=denv e2e other CA $tag" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    -keyout "$d/other-ca.key" -out "$d/other-ca.pem" 2>/dev/null || return 1
  openssl req "${ec[@]}" -subj "/CN=denv e2e server" -keyout "$d/key.pem" -out "$d/server.csr" 2>/dev/null || return 1
  printf 'subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost%s\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n' "${TLS_EXTRA_SAN:+,$TLS_EXTRA_SAN}" >"$d/server.ext"
  openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial -days 2 \
    -extfile "$d/server.ext" -out "$d/server.pem" 2>/dev/null || { echo "tls_make: openssl could not sign the server's certificate"; return 1; }
  cat "$d/server.pem" "$d/ca.pem" >"$d/cert.pem"
}
