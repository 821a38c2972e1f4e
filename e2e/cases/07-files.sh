# denv files put|get and the REST tar routes.
# allow-error: tower_http::trace::on_failure: response failed classification=Status code: 502 Bad Gateway
denv project create files >/dev/null
printf 'services:\n  box:\n    image: python:3.12-slim\n    user: "1000:1000"\n    command: ["sleep","infinity"]\n    volumes: ["w:/work"]\nvolumes: { w: {} }\n' > c.yaml
denv deploy --project files -f c.yaml
ENV=$(env_id files alpha)
mkdir -p fixtures/sub; echo alpha > fixtures/a.txt; echo beta > fixtures/sub/b.txt
denv files put $ENV --service box ./fixtures /work/in
assert_eq "$(exec_out $ENV box cat /work/in/fixtures/sub/b.txt)" beta "uploaded file"
OUT=$(denv files get $ENV --service box /work/in ./out); echo "$OUT"
assert_contains "$OUT" "files written under"
assert_eq "$(cat out/in/fixtures/a.txt 2>/dev/null || cat out/fixtures/a.txt 2>/dev/null || find out -name a.txt -exec cat {} \;)" alpha "downloaded file"
tar -C fixtures -cf - . > up.tar
api PUT "/v1/envs/$ENV/files?service=box&path=/work/rest" -H 'Content-Type: application/x-tar' --data-binary @up.tar
assert_eq "$API_STATUS" 200 "PUT files status"
api GET "/v1/envs/$ENV/files?service=box&path=/work/rest/a.txt"; cp "$API_BODY_FILE" got.tar
assert_eq "$API_STATUS" 200 "GET files status"
assert_eq "$(tar -xOf got.tar)" alpha "tar from REST"
api GET "/v1/envs/$ENV/files?service=box&path=/work/missing"
assert_eq "$API_STATUS" 502 "missing path status"
head -c 40000000 /dev/zero > big.bin; tar -cf big.tar big.bin
api PUT "/v1/envs/$ENV/files?service=box&path=/work" -H 'Content-Type: application/x-tar' --data-binary @big.tar
assert_eq "$API_STATUS" 413 "oversized upload status"
denv env destroy $ENV >/dev/null; wait_destroyed $ENV
