//! A tiny WebDriver client (the W3C protocol over HTTP + JSON) driving headless Chromium
//! through chromedriver: the few calls a page test needs. Debian's `chromium` and
//! `chromium-driver` packages provide the two binaries.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use http::Method;
use serde_json::{Value, json};

use super::{Http, Proc, eventually, free_addr};

/// The key under which WebDriver names an element.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

fn find_binary(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    names.iter().find_map(|name| {
        std::env::split_paths(&path)
            .chain([
                PathBuf::from("/usr/bin"),
                PathBuf::from("/usr/lib/chromium"),
            ])
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    })
}

/// Chromium and chromedriver, when both are installed. Their absence fails the test, as
/// [`idem_testkit::probe::missing`] decides: `None` only when the run skips missing tools on
/// purpose (`IDEM_TEST_SKIP_MISSING=1`, outside CI), after a loud SKIPPED line.
pub fn browser() -> Option<(PathBuf, PathBuf)> {
    let chromium = find_binary(&["chromium", "chromium-browser", "google-chrome"]);
    let driver = find_binary(&["chromedriver"]);
    if let (Some(chromium), Some(driver)) = (chromium.clone(), driver.clone()) {
        return Some((chromium, driver));
    }
    let message = format!(
        "headless Chromium is not installed (chromium: {chromium:?}, chromedriver: {driver:?}): apt-get install chromium chromium-driver (see .ci/run)"
    );
    idem_testkit::probe::missing(&message);
    None
}

/// A chromedriver process and one headless session in it; both end when dropped (or with
/// [`Browser::quit`]).
pub struct Browser {
    http: Http,
    base: String,
    session: String,
    _profile: TempDir,
    _driver: Proc,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Browser {
    /// Starts chromedriver on a free port and opens a headless session of `chromium`.
    pub async fn start(chromium: &Path, driver: &Path) -> Browser {
        let port = free_addr().port();
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let driver_proc = Proc { child };
        let base = format!("http://127.0.0.1:{port}");
        let http = Http::new();
        let ready = eventually(Duration::from_secs(20), || {
            let (http, url) = (http.clone(), format!("{base}/status"));
            async move {
                let Ok(reply) = http.try_send(Method::GET, &url, &[], "").await else {
                    return false;
                };
                serde_json::from_slice::<Value>(&reply.body)
                    .is_ok_and(|status| status["value"]["ready"] == true)
            }
        })
        .await;
        assert!(ready, "chromedriver did not become ready on port {port}");
        let profile =
            std::env::temp_dir().join(format!("idem-ui-chromium-{}-{port}", std::process::id()));
        let capabilities = json!({
            "capabilities": { "alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": chromium,
                    "args": [
                        "--headless=new", "--no-sandbox", "--disable-gpu",
                        "--disable-dev-shm-usage", "--no-first-run",
                        "--window-size=1280,900",
                        format!("--user-data-dir={}", profile.display()),
                    ],
                },
            }},
        });
        let mut browser = Browser {
            http,
            base,
            session: String::new(),
            _profile: TempDir(profile),
            _driver: driver_proc,
        };
        let value = browser.call(Method::POST, "/session", &capabilities).await;
        browser.session = value["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session id in {value}"))
            .to_owned();
        browser
    }

    /// One WebDriver command; returns its `value`, panicking on a WebDriver error.
    async fn call(&self, method: Method, path: &str, body: &Value) -> Value {
        let body = if method == Method::GET || method == Method::DELETE {
            String::new()
        } else {
            body.to_string()
        };
        let reply = self
            .http
            .send(
                method,
                &format!("{}{path}", self.base),
                &[("content-type", "application/json")],
                body,
            )
            .await;
        let mut value: Value = serde_json::from_slice(&reply.body).unwrap();
        assert!(
            reply.status == 200,
            "WebDriver {path}: {} {value}",
            reply.status
        );
        value["value"].take()
    }

    fn session_path(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    /// Loads `url` and waits for the page.
    pub async fn navigate(&self, url: &str) {
        self.call(
            Method::POST,
            &self.session_path("/url"),
            &json!({ "url": url }),
        )
        .await;
    }

    /// The first element matching the CSS `selector`, if any.
    pub async fn find(&self, selector: &str) -> Option<String> {
        let reply = self
            .http
            .send(
                Method::POST,
                &format!("{}{}", self.base, self.session_path("/element")),
                &[("content-type", "application/json")],
                json!({ "using": "css selector", "value": selector }).to_string(),
            )
            .await;
        if reply.status != 200 {
            return None;
        }
        let value: Value = serde_json::from_slice(&reply.body).unwrap();
        value["value"][ELEMENT].as_str().map(str::to_owned)
    }

    /// Clicks an element (a submit button navigates).
    pub async fn click(&self, element: &str) {
        self.call(
            Method::POST,
            &self.session_path(&format!("/element/{element}/click")),
            &json!({}),
        )
        .await;
    }

    /// Types `text` into an element.
    pub async fn type_text(&self, element: &str, text: &str) {
        self.call(
            Method::POST,
            &self.session_path(&format!("/element/{element}/value")),
            &json!({ "text": text }),
        )
        .await;
    }

    /// The current page's HTML.
    pub async fn source(&self) -> String {
        let value = self
            .call(Method::GET, &self.session_path("/source"), &Value::Null)
            .await;
        value.as_str().unwrap_or_default().to_owned()
    }

    /// The current page's title.
    pub async fn title(&self) -> String {
        let value = self
            .call(Method::GET, &self.session_path("/title"), &Value::Null)
            .await;
        value.as_str().unwrap_or_default().to_owned()
    }

    /// Ends the session (the browser exits); the driver stops when dropped.
    pub async fn quit(self) {
        self.call(Method::DELETE, &self.session_path(""), &Value::Null)
            .await;
    }
}
