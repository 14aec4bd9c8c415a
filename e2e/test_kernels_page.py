def test_kernels_page_times_every_kernel_and_shows_its_wgsl(page, live_server, page_errors):
    page.goto(live_server + "/kernels")
    page.wait_for_function("document.body.dataset.profiled === '1'", timeout=120_000)
    rows = page.locator("#kernels tbody tr")
    labels = [rows.nth(i).get_attribute("data-kernel") for i in range(rows.count())]
    for k in ("linear", "attention", "attention_backward_dkdv", "rmsnorm", "cross_entropy",
              "optimizer grad norm (adamw)", "optimizer update (adamw)"):
        assert k in labels, labels
    times = [float(rows.nth(i).locator("td").nth(3).inner_text()) for i in range(rows.count())]
    assert all(t >= 0 for t in times) and sum(times) > 0
    page.click("tr[data-kernel='attention'] a")
    page.wait_for_function("document.getElementById('source').textContent.includes('@compute')")
    # The WGSL it ran: the row kernel at tiny's T 64 on a GPU, its generated twin on a software
    # adapter (attention_direct.js), includes expanded.
    title = page.inner_text("#source-title")
    assert title in ("05_attention_rows.wgsl",
                     "attention_direct.js forward D16 (entry point main_direct)"), title
    assert "fn block_of" in page.inner_text("#source")     # lib/attention_rows.wgsl's
    assert page_errors == []


def test_kernels_page_profiles_the_8bit_optimizer_and_another_preset(page, live_server,
                                                                    page_errors):
    """Any preset, batch and optimizer variant: the fp32-against-8-bit comparison per kernel."""
    page.goto(live_server + "/kernels")
    page.wait_for_function("document.body.dataset.profiled === '1'", timeout=120_000)
    page.evaluate("delete document.body.dataset.profiled")
    page.select_option("#optimizer", "adamw_8bit")
    page.fill("#batch", "2")
    page.click("#run")
    page.wait_for_function("document.body.dataset.profiled === '1'", timeout=120_000)
    rows = page.locator("#kernels tbody tr")
    labels = [rows.nth(i).get_attribute("data-kernel") for i in range(rows.count())]
    assert "optimizer update (adamw_8bit)" in labels and "optimizer grad norm (adamw_8bit)" \
        in labels, labels
    assert "batch 2" in page.inner_text("#status")
    page.click("tr[data-kernel='optimizer update (adamw_8bit)'] a")
    page.wait_for_function("document.getElementById('source').textContent.includes('adamw_8bit_update')")
    assert "adamw_8bit_update" in page.inner_text("#source-title")
    assert page_errors == []
