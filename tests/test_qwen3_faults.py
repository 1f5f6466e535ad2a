

def test_a_poisoned_audio_request_among_twelve_streams_fails_alone(running):
    """Float WAV samples at 1e38 (finite, but the features overflow to NaN): a 400 at the API; the
    12 streams live meanwhile and the requests after it succeed."""
    import base64
    import io
    import threading

    import numpy as np
    import soundfile as sf

    url = running.http.url + "/v1/chat/completions"
    model = requests.get(running.http.url + "/v1/models", timeout=10).json()["data"][0]["id"]

    def body(content, **extra):
        return {"model": model, "messages": [{"role": "user", "content": content}], "temperature": 0, **extra}

    def wav(value: float) -> str:
        buf = io.BytesIO()
        sf.write(buf, np.full(16000, value, np.float32), 16000, format="WAV", subtype="FLOAT")
        return base64.b64encode(buf.getvalue()).decode()

    results = []

    def stream():
        with requests.post(url, json=body("talk", stream=True, max_tokens=60, ignore_eos=True), stream=True,
                           timeout=120) as r:
            results.append((r.status_code, sum(1 for line in r.iter_lines() if line.startswith(b"data: {"))))

    threads = [threading.Thread(target=stream) for _ in range(12)]
    for t in threads:
        t.start()
    poisoned = requests.post(url, json=body([{"type": "input_audio", "input_audio": {"data": wav(1e38),
                                                                                    "format": "wav"}}]), timeout=60)
    for t in threads:
        t.join(120)
    assert poisoned.status_code == 400 and "audio samples must lie within" in poisoned.json()["error"]["message"]
    assert len(results) == 12 and all(status == 200 and chunks >= 60 for status, chunks in results), results
    parts = [{"type": "text", "text": "hear"}, {"type": "input_audio", "input_audio": {"data": wav(0.5), "format": "wav"}}]
    after = [requests.post(url, json=body(parts, max_tokens=4), timeout=60) for _ in range(3)]
    assert all(r.status_code == 200 for r in after), [r.text for r in after]
