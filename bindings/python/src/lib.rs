//! `denv._native`: the pyo3 module under the `denv` Python package (spec page
//! `14-ref-python.md`; Python side in `bindings/python/python/denv/`).
//!
//! A thin bridge over [`denv_client::Client`]: the module owns one multi-threaded Tokio
//! runtime, every call releases the GIL while it waits on the network, and messages
//! cross the boundary as JSON text in the REST API's shapes (through
//! [`denv_proto::json`]). Tar archives cross as `bytes`. `pack_context` packs a build
//! context with the CLI's own packer ([`denv_client::context::pack`]).
//!
//! Errors raise `denv.DenvError` (a `RuntimeError`, also reachable as
//! `denv._native.DenvError`) built by the Python function `denv.errors.error_for` from
//! the error's HTTP status (the one the control plane sent,
//! [`ClientError::http_status`]; no table here derives it from the gRPC code), the gRPC
//! code name and the message.

use denv_client::{ClientError, Code};
use denv_proto::json::{from_json, to_json};
use denv_proto::v1;
use pyo3::exceptions::{PyNotADirectoryError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

/// The RPC names [`PyClient::call`] accepts.
pub const METHODS: &[&str] = &[
    "Health",
    "Me",
    "ListProjects",
    "CreateProject",
    "ListEnvs",
    "Deploy",
    "GetEnv",
    "ListVersions",
    "ListDeployments",
    "Fork",
    "Snapshot",
    "Rollback",
    "Verify",
    "Exec",
    "Destroy",
    "GetDeployment",
    "CreateSandbox",
    "ListEvents",
    "ListAllEnvs",
    "DeleteProject",
    "Promote",
    "GetSheet",
];

/// The Python module that turns a failure into an exception (`error_for`), and whose
/// `DenvError` this module re-exports.
const ERRORS_MODULE: &str = "denv.errors";

/// The HTTP status of an error: the server's, else `0` (unknown).
pub fn status_of(e: &ClientError) -> u16 {
    e.http_status.unwrap_or(0)
}

/// The exception for `e`: `denv.errors.error_for(status, code, message)`, the one place
/// its class is picked. Should that module fail to load, a plain `RuntimeError` with
/// the same text.
fn to_py_err(e: ClientError) -> PyErr {
    Python::with_gil(|py| {
        let status = status_of(&e);
        let code = format!("{:?}", e.code);
        let built = py
            .import(ERRORS_MODULE)
            .and_then(|m| m.getattr("error_for"))
            .and_then(|f| f.call1((status, code, e.message.as_str())));
        match built {
            Ok(exc) => PyErr::from_value(exc),
            Err(_) => PyRuntimeError::new_err(format!("denv {status}: {}", e.message)),
        }
    })
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("denv-native")
            .enable_all()
            .build()
            .expect("tokio runtime")
    })
}

fn parse<T: DeserializeOwned>(json: &str) -> Result<T, ClientError> {
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| {
        ClientError::new(Code::InvalidArgument, format!("request is not json: {e}"))
            .with_status(400)
    })?;
    from_json(v).map_err(|e| {
        ClientError::new(Code::InvalidArgument, format!("bad request: {e}")).with_status(400)
    })
}

fn render<T: Serialize>(msg: &T) -> String {
    to_json(msg).to_string()
}

/// Runs `fut` on the module's runtime with a deadline, the GIL released.
fn block<T: Send>(
    py: Python<'_>,
    timeout: Duration,
    fut: impl Future<Output = Result<T, ClientError>> + Send,
) -> PyResult<T> {
    py.allow_threads(|| {
        runtime().block_on(async {
            match tokio::time::timeout(timeout, fut).await {
                Ok(r) => r,
                Err(_) => Err(ClientError::new(
                    Code::DeadlineExceeded,
                    format!("no answer within {}s", timeout.as_secs_f64()),
                )
                .with_status(504)),
            }
        })
    })
    .map_err(to_py_err)
}

/// Dispatches one unary RPC by name with a JSON request; returns the JSON response.
pub async fn dispatch(
    c: &denv_client::Client,
    method: &str,
    json: &str,
) -> Result<String, ClientError> {
    macro_rules! go {
        ($m:ident) => {
            Ok(render(&c.$m(parse(json)?).await?))
        };
    }
    match method {
        "Health" => go!(health),
        "Me" => go!(me),
        "ListProjects" => go!(list_projects),
        "CreateProject" => go!(create_project),
        "ListEnvs" => go!(list_envs),
        "Deploy" => go!(deploy),
        "GetEnv" => go!(get_env),
        "ListVersions" => go!(list_versions),
        "ListDeployments" => go!(list_deployments),
        "Fork" => go!(fork),
        "Snapshot" => go!(snapshot),
        "Rollback" => go!(rollback),
        "Verify" => go!(verify),
        "Exec" => go!(exec),
        "Destroy" => go!(destroy),
        "GetDeployment" => go!(get_deployment),
        "CreateSandbox" => go!(create_sandbox),
        "ListEvents" => go!(list_events),
        "ListAllEnvs" => go!(list_all_envs),
        "DeleteProject" => go!(delete_project),
        "Promote" => go!(promote),
        "GetSheet" => go!(get_sheet),
        other => Err(
            ClientError::new(Code::Unimplemented, format!("unknown method {other:?}"))
                .with_status(404),
        ),
    }
}

/// `denv._native.Client(server, api_key, team=None, timeout_sec=900.0, ca_file=None)`:
/// one control plane (`http://` or `https://`; `ca_file`: a PEM file of the CA
/// certificates an `https://` server's certificate is checked against instead of the
/// built-in and system roots, read here). The channel connects lazily on the first call.
#[pyclass(name = "Client", module = "denv._native", frozen)]
pub struct PyClient {
    inner: denv_client::Client,
    timeout: Duration,
}

impl PyClient {
    fn deadline(&self, timeout_sec: Option<f64>) -> PyResult<Duration> {
        let secs = timeout_sec.unwrap_or(self.timeout.as_secs_f64());
        Duration::try_from_secs_f64(secs)
            .map_err(|_| PyValueError::new_err(format!("invalid timeout {secs}")))
    }
}

#[pymethods]
impl PyClient {
    #[new]
    #[pyo3(signature = (server, api_key, team=None, timeout_sec=900.0, ca_file=None))]
    fn new(
        server: &str,
        api_key: &str,
        team: Option<&str>,
        timeout_sec: f64,
        ca_file: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        let timeout = Duration::try_from_secs_f64(timeout_sec)
            .map_err(|_| PyValueError::new_err(format!("invalid timeout {timeout_sec}")))?;
        let _guard = runtime().enter();
        let inner =
            denv_client::Client::connect_with(server, Some(api_key), team, ca_file.as_deref())
                .map_err(to_py_err)?;
        Ok(PyClient { inner, timeout })
    }

    /// The server's base URL.
    #[getter]
    fn server(&self) -> String {
        self.inner.server().to_string()
    }

    /// Calls the unary RPC `method` (see `methods()`) with a JSON request; returns JSON.
    #[pyo3(signature = (method, request_json, timeout_sec=None))]
    fn call(
        &self,
        py: Python<'_>,
        method: &str,
        request_json: &str,
        timeout_sec: Option<f64>,
    ) -> PyResult<String> {
        let d = self.deadline(timeout_sec)?;
        block(py, d, dispatch(&self.inner, method, request_json))
    }

    /// Extracts the tar archive `tar` into `path` of `service`; returns
    /// `{"ok": true, "bytes": N}` as JSON.
    #[pyo3(signature = (env, service, path, tar, timeout_sec=None))]
    fn put_files(
        &self,
        py: Python<'_>,
        env: &str,
        service: &str,
        path: &str,
        tar: Vec<u8>,
        timeout_sec: Option<f64>,
    ) -> PyResult<String> {
        let d = self.deadline(timeout_sec)?;
        let req = v1::PutFilesRequest {
            env: env.to_string(),
            service: service.to_string(),
            path: path.to_string(),
            tar,
        };
        let c = &self.inner;
        block(py, d, async move { Ok(render(&c.put_files(req).await?)) })
    }

    /// A tar archive of `path` in `service`, as bytes.
    #[pyo3(signature = (env, service, path, timeout_sec=None))]
    fn get_files<'py>(
        &self,
        py: Python<'py>,
        env: &str,
        service: &str,
        path: &str,
        timeout_sec: Option<f64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let d = self.deadline(timeout_sec)?;
        let req = v1::GetFilesRequest {
            env: env.to_string(),
            service: service.to_string(),
            path: path.to_string(),
        };
        let c = &self.inner;
        let tar = block(py, d, async move { Ok(c.get_files(req).await?.tar) })?;
        Ok(PyBytes::new(py, &tar))
    }

    /// Waits until deployment `id` is final (at most `timeout_sec` seconds); returns
    /// `{deployment, phases}` as JSON.
    fn wait_deployment(&self, py: Python<'_>, id: &str, timeout_sec: f64) -> PyResult<String> {
        let d = self.deadline(Some(timeout_sec))?;
        let c = &self.inner;
        block(py, d, async move {
            Ok(render(&c.wait_deployment(id, |_| {}).await?))
        })
    }

    /// Starts `Logs` with a JSON `LogsRequest`; returns a [`PyLogStream`] (refusals,
    /// such as an unknown service, raise here, within `timeout_sec`).
    #[pyo3(signature = (request_json, timeout_sec=None))]
    fn logs(
        &self,
        py: Python<'_>,
        request_json: &str,
        timeout_sec: Option<f64>,
    ) -> PyResult<PyLogStream> {
        let d = self.deadline(timeout_sec)?;
        let c = self.inner.clone();
        let req: v1::LogsRequest = parse(request_json).map_err(to_py_err)?;
        let stream = block(py, d, async move { c.logs(req).await })?;
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, ClientError>>(256);
        let task = runtime().spawn(async move {
            use futures::StreamExt;
            let mut stream = stream;
            while let Some(item) = stream.next().await {
                let item = item.map(|e| render(&e));
                if tx.send(item).await.is_err() {
                    return;
                }
            }
        });
        Ok(PyLogStream {
            rx: tokio::sync::Mutex::new(rx),
            task,
        })
    }

    fn __repr__(&self) -> String {
        format!("Client(server={:?})", self.inner.server())
    }
}

/// The lines of a `Client.logs` call: `next_json(timeout_sec)` returns the next
/// `LogEntry` as JSON, `None` at the end, or raises `TimeoutError` when no line came
/// within `timeout_sec` (`None`: wait as long as it takes). `close()` ends the call
/// (a follow is cancelled on the host); so does dropping the object.
#[pyclass(name = "LogStream", module = "denv._native", frozen)]
pub struct PyLogStream {
    rx: tokio::sync::Mutex<tokio::sync::mpsc::Receiver<Result<String, ClientError>>>,
    task: tokio::task::JoinHandle<()>,
}

#[pymethods]
impl PyLogStream {
    #[pyo3(signature = (timeout_sec=None))]
    fn next_json(&self, py: Python<'_>, timeout_sec: Option<f64>) -> PyResult<Option<String>> {
        let limit = match timeout_sec {
            None => None,
            Some(s) => Some(
                Duration::try_from_secs_f64(s)
                    .map_err(|_| PyValueError::new_err(format!("invalid timeout {s}")))?,
            ),
        };
        let r = py.allow_threads(|| {
            runtime().block_on(async {
                let mut rx = self.rx.lock().await;
                match limit {
                    None => Ok(rx.recv().await),
                    Some(l) => tokio::time::timeout(l, rx.recv()).await.map_err(|_| ()),
                }
            })
        });
        match r {
            Err(()) => Err(pyo3::exceptions::PyTimeoutError::new_err(
                "no log line within the timeout",
            )),
            Ok(None) => Ok(None),
            Ok(Some(Ok(json))) => Ok(Some(json)),
            Ok(Some(Err(e))) => Err(to_py_err(e)),
        }
    }

    fn close(&self) {
        self.task.abort();
    }
}

impl Drop for PyLogStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The RPC names `Client.call` accepts.
#[pyfunction]
fn methods() -> Vec<&'static str> {
    METHODS.to_vec()
}

/// `pack_context(dir, dockerfiles=None) -> bytes`: the uncompressed tar of build context
/// `dir` that `denv deploy` sends ([`denv_client::context::pack`]: `.dockerignore`
/// honoured, `dockerfiles` and `.dockerignore` always kept, deterministic). Raises
/// `NotADirectoryError` when `dir` is not a directory, `ValueError` past 32 MiB or for a
/// `.dockerignore` line that does not parse, `OSError` when a file cannot be read. The
/// GIL is released while packing.
#[pyfunction]
#[pyo3(signature = (dir, dockerfiles=None))]
fn pack_context(
    py: Python<'_>,
    dir: std::path::PathBuf,
    dockerfiles: Option<Vec<String>>,
) -> PyResult<Py<PyBytes>> {
    use denv_client::context::PackError;
    let dockerfiles = dockerfiles.unwrap_or_default();
    let r = py.allow_threads(|| {
        let names: Vec<&str> = dockerfiles.iter().map(String::as_str).collect();
        denv_client::context::pack(&dir, &names)
    });
    match r {
        Ok(tar) => Ok(PyBytes::new(py, &tar).unbind()),
        Err(e @ PackError::NotADirectory(_)) => Err(PyNotADirectoryError::new_err(e.to_string())),
        Err(e @ (PackError::TooLarge { .. } | PackError::Ignore { .. })) => {
            Err(PyValueError::new_err(e.to_string()))
        }
        Err(e @ PackError::Io { .. }) => Err(PyOSError::new_err(e.to_string())),
    }
}

/// The module `denv._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyClient>()?;
    m.add_class::<PyLogStream>()?;
    m.add(
        "DenvError",
        m.py().import(ERRORS_MODULE)?.getattr("DenvError")?,
    )?;
    m.add_function(wrap_pyfunction!(methods, m)?)?;
    m.add_function(wrap_pyfunction!(pack_context, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_is_the_servers_not_a_table() {
        let mut s = tonic_status(Code::FailedPrecondition, "authorization_pending");
        s.metadata_mut()
            .insert(denv_client::HTTP_STATUS_KEY, "428".parse().unwrap());
        assert_eq!(status_of(&ClientError::from(s)), 428);
        // Without the metadata nothing is guessed from the code.
        let e = ClientError::from(tonic_status(Code::NotFound, "x"));
        assert_eq!(status_of(&e), 0);
    }

    fn tonic_status(code: Code, msg: &str) -> tonic::Status {
        tonic::Status::new(code, msg)
    }

    #[test]
    fn every_listed_method_dispatches() {
        let rt = runtime();
        let c = {
            let _g = rt.enter();
            denv_client::Client::connect("http://127.0.0.1:9", Some("dak_x"), None).unwrap()
        };
        for m in METHODS {
            // A malformed request is refused before any network call, which proves the
            // name is routed to a typed method.
            let err = rt.block_on(dispatch(&c, m, "[1]")).unwrap_err();
            assert_eq!(err.code, Code::InvalidArgument, "{m}: {}", err.message);
            assert_eq!(err.http_status, Some(400));
        }
        let err = rt.block_on(dispatch(&c, "Nope", "{}")).unwrap_err();
        assert_eq!(err.code, Code::Unimplemented);
    }

    #[test]
    fn requests_parse_from_rest_json() {
        let r: v1::CreateSandboxRequest =
            parse(r#"{"image":"busybox:1.36","cmd":["sleep","infinity"],"ports":["8000"]}"#)
                .unwrap();
        assert_eq!(r.image, "busybox:1.36");
        assert_eq!(r.cmd, vec!["sleep", "infinity"]);
        assert_eq!(r.ports, vec!["8000"]);
        // `resources` (a Struct) travels as given; the server validates it.
        let f: v1::ForkRequest =
            parse(r#"{"env":"env_1","resources":{"cpus":0.5,"memory":"64m"}}"#).unwrap();
        let res = denv_proto::json::from_struct(&f.resources.unwrap());
        assert_eq!(res, serde_json::json!({"cpus": 0.5, "memory": "64m"}));
        assert!(parse::<v1::ExecRequest>("not json").is_err());
    }

    #[test]
    fn unreachable_server_is_an_error_not_a_hang() {
        let rt = runtime();
        let c = {
            let _g = rt.enter();
            denv_client::Client::connect("http://127.0.0.1:9", Some("dak_x"), None).unwrap()
        };
        let err = rt
            .block_on(dispatch(&c, "GetEnv", r#"{"env":"env_1"}"#))
            .unwrap_err();
        assert_eq!(err.code, Code::Unavailable);
        assert_eq!(err.http_status, Some(denv_client::TRANSPORT_STATUS));
    }
}
