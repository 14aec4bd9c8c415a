from tests.browser import CHROMIUM, PAGE_WAIT_MS, QUIET_FLAGS


def test_diagnostics_reports_webgpu_ok(page, live_server, page_errors):
    page.goto(live_server + "/diagnostics")
    page.wait_for_function("document.body.dataset.webgpu !== undefined", timeout=PAGE_WAIT_MS)
    assert page.evaluate("document.body.dataset.webgpu") == "ok", page.inner_text("main")
    diag = page.evaluate("window.andreaDiagnostics")
    st = diag["selftest"]
    assert st["passed"] is True
    assert st["n"] == 1000 and st["workgroups"] == 16
    assert st["maxError"] == 0 and st["sumErrors"] == 0
    assert st["sample"] == [1.0, 3.0, 5.0, 7.0]  # 2*x+1 for x = 0,1,2,3
    # The engine asked for the adapter's real limits, not WebGPU's defaults.
    assert diag["limits"]["maxStorageBufferBindingSize"] >= 128 * 1024 * 1024
    assert diag["limits"]["maxStorageBuffersPerShaderStage"] >= 8
    print("\nadapter:", diag["adapter"], "\nfeatures:", diag["features"],
          "\nlimits:", diag["limits"])
    assert page.locator("#status").inner_text().startswith("WebGPU works")
    assert page_errors == []


def test_diagnostics_explains_missing_webgpu(playwright, live_server):
    # Same Chromium, without the WebGPU flags: the page must say why, not fail silently.
    browser = playwright.chromium.launch(executable_path=CHROMIUM,
                                         args=["--headless=new", *QUIET_FLAGS,
                                               "--disable-features=WebGPU", "--disable-gpu"])
    try:
        page = browser.new_page()
        page.goto(live_server + "/diagnostics")
        page.wait_for_function("document.body.dataset.webgpu !== undefined", timeout=PAGE_WAIT_MS)
        assert page.evaluate("document.body.dataset.webgpu") == "unavailable"
        explain = page.locator("#explain")
        assert explain.is_visible()
        text = explain.inner_text()
        assert "WebGPU" in text and ("--enable-unsafe" in text or "adapter" in text)
    finally:
        browser.close()
