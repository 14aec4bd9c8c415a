def test_kernels_page_times_every_kernel_and_shows_its_wgsl(page, live_server, page_errors):
    page.goto(live_server + "/kernels")
    page.wait_for_function("document.body.dataset.profiled === '1'", timeout=120_000)
    rows = page.locator("#kernels tbody tr")
    labels = [rows.nth(i).get_attribute("data-kernel") for i in range(rows.count())]
    for k in ("linear", "attention", "attention_backward_dkdv", "rmsnorm", "cross_entropy",
              "optimizer (norm + clip + AdamW)"):
        assert k in labels, labels
    times = [float(rows.nth(i).locator("td").nth(3).inner_text()) for i in range(rows.count())]
    assert all(t >= 0 for t in times) and sum(times) > 0
    page.click("tr[data-kernel='attention'] a")
    page.wait_for_function("document.getElementById('source').textContent.includes('@compute')")
    assert "05_attention.wgsl" in page.inner_text("#source-title")
    assert page_errors == []
