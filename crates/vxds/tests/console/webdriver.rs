//! Just enough of the W3C WebDriver protocol to drive Debian's headless Chromium through
//! `chromedriver`: sessions, navigation, elements (find, click, type, text), scripts and
//! screenshots, as JSON over HTTP with reqwest (already a dependency; a WebDriver client crate
//! would bring its own HTTP stack for these few calls).

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

/// The key W3C WebDriver names element references with.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

const INSTALL: &str = "install Debian's `chromium` and `chromium-driver` (`apt-get install chromium \
    chromium-driver`; .ci/run does), or point CHROMIUM and CHROMEDRIVER at them";

fn required(var: &str, default: &str) -> PathBuf {
    let path = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default));
    assert!(
        path.exists(),
        "the console tests need {} at {}: {INSTALL}",
        var.to_lowercase(),
        path.display()
    );
    path
}

/// A running chromedriver in a process group of its own, killed with its browsers on drop.
pub struct Driver {
    child: Child,
    base: String,
    http: reqwest::Client,
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The browsers chromedriver started are in its group: killing chromedriver alone left
        // a browser still closing to init (a whole Chromium after each CI run).
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    pub async fn start(log: &Path) -> Driver {
        let driver = required("CHROMEDRIVER", "/usr/bin/chromedriver");
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(&driver)
            .arg(format!("--port={port}"))
            .arg(format!("--log-path={}", log.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}; {INSTALL}", driver.display()));
        let driver = Driver {
            child,
            base: format!("http://127.0.0.1:{port}"),
            // A wedged browser or driver fails the test instead of hanging CI.
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(response) = driver
                .http
                .get(format!("{}/status", driver.base))
                .send()
                .await
                && let Ok(status) = response.json::<Value>().await
                && status["value"]["ready"] == true
            {
                return driver;
            }
            assert!(Instant::now() < deadline, "chromedriver never became ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A headless Chromium session.
    pub async fn session(&self) -> Session {
        let chromium = required("CHROMIUM", "/usr/bin/chromium");
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1440,1200", "--force-device-scale-factor=1", "--lang=en-US",
                         "--disable-crash-reporter", "--disable-breakpad"],
            },
        }}});
        let value = call(
            &self.http,
            reqwest::Method::POST,
            &format!("{}/session", self.base),
            Some(capabilities),
        )
        .await;
        let id = value["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {value}"))
            .to_owned();
        Session {
            http: self.http.clone(),
            base: format!("{}/session/{id}", self.base),
        }
    }
}

async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<Value>,
) -> Value {
    try_call(http, method.clone(), url, body)
        .await
        .unwrap_or_else(|error| panic!("{method} {url}: {error}"))
}

/// The command's value, or the WebDriver error.
async fn try_call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<Value>,
) -> Result<Value, Value> {
    let mut request = http.request(method, url);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let value: Value = response.json().await.unwrap_or(Value::Null);
    if status.is_success() {
        Ok(value["value"].clone())
    } else {
        Err(value["value"].clone())
    }
}

/// One browser session; deleted (the browser closed) on drop.
pub struct Session {
    http: reqwest::Client,
    base: String,
}

impl Drop for Session {
    fn drop(&mut self) {
        // Closing the browser is best effort: chromedriver's own drop kills what is left.
        let http = self.http.clone();
        let url = self.base.clone();
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(runtime) = runtime {
                let _ = runtime.block_on(http.delete(url).send());
            }
        })
        .join();
    }
}

#[derive(Clone, Debug)]
pub struct Element(String);

impl Session {
    async fn post(&self, path: &str, body: Value) -> Value {
        call(
            &self.http,
            reqwest::Method::POST,
            &format!("{}{path}", self.base),
            Some(body),
        )
        .await
    }

    async fn get(&self, path: &str) -> Value {
        call(
            &self.http,
            reqwest::Method::GET,
            &format!("{}{path}", self.base),
            None,
        )
        .await
    }

    pub async fn goto(&self, url: &str) {
        self.post("/url", json!({"url": url})).await;
    }

    pub async fn find_all(&self, css: &str) -> Vec<Element> {
        let found = self
            .post("/elements", json!({"using": "css selector", "value": css}))
            .await;
        found
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e[ELEMENT].as_str().map(|id| Element(id.to_owned())))
            .collect()
    }

    /// Waits until `css` matches at least `count` elements.
    pub async fn wait_for_count(&self, css: &str, count: usize) -> Vec<Element> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let found = self.find_all(css).await;
            if found.len() >= count {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "`{css}` matched {} element(s), not {count}; the page: {}",
                found.len(),
                self.page_text().await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn wait_for(&self, css: &str) -> Element {
        self.wait_for_count(css, 1).await.remove(0)
    }

    /// The rendered text of every element `css` matches, read in one script (the console
    /// re-renders on live events, so element references may go stale between calls).
    pub async fn texts(&self, css: &str) -> Vec<String> {
        self.post(
            "/execute/sync",
            json!({"script": "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.innerText)", "args": [css]}),
        )
        .await
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| t.as_str().unwrap_or_default().to_owned())
        .collect()
    }

    /// The attribute `name` of every element `css` matches.
    pub async fn attributes(&self, css: &str, name: &str) -> Vec<Option<String>> {
        self.post(
            "/execute/sync",
            json!({"script": "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.getAttribute(arguments[1]))", "args": [css, name]}),
        )
        .await
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| t.as_str().map(str::to_owned))
        .collect()
    }

    /// Clicks the first element `css` matches, finding it again if a re-render replaced it.
    pub async fn click_css(&self, css: &str) {
        self.on_fresh(css, "click", json!({})).await;
    }

    /// Types `text` into the first element `css` matches (cleared first).
    pub async fn type_css(&self, css: &str, text: &str) {
        self.on_fresh(css, "clear", json!({})).await;
        self.on_fresh(css, "value", json!({"text": text})).await;
    }

    async fn on_fresh(&self, css: &str, command: &str, body: Value) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let element = self.wait_for(css).await;
            let url = format!("{}/element/{}/{command}", self.base, element.0);
            match try_call(&self.http, reqwest::Method::POST, &url, Some(body.clone())).await {
                Ok(_) => return,
                Err(error) if error["error"] == "stale element reference" => {
                    assert!(Instant::now() < deadline, "`{css}` keeps going stale");
                }
                Err(error) => panic!("{command} on `{css}`: {error}"),
            }
        }
    }

    /// Waits until the text of an element `css` matches contains `needle`, and returns it.
    pub async fn wait_for_text(&self, css: &str, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            for text in self.texts(css).await {
                if text.contains(needle) {
                    return text;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no `{css}` shows {needle:?}; the page: {}",
                self.page_text().await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn script(&self, script: &str) -> Value {
        self.post("/execute/sync", json!({"script": script, "args": []}))
            .await
    }

    pub async fn page_text(&self) -> String {
        self.script("return document.body.innerText")
            .await
            .to_string()
    }

    /// A PNG of the viewport.
    pub async fn screenshot(&self) -> Vec<u8> {
        let encoded = self.get("/screenshot").await;
        base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().unwrap_or_default())
            .unwrap()
    }
}
