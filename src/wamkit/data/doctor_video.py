"""The doctor's checks of the videos: each file opened, its last GOP decoded to find where the stream ends."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from wamkit.data.doctor_base import VIDEO_FIELDS, DoctorBase


class VideoChecks(DoctorBase):
    """Video files against meta/episodes spans and info.json shapes."""

    # ---- videos ---------------------------------------------------------------------------------
    def check_videos(self) -> None:
        cams = self.expect.camera_keys or sorted(k for k, f in self.features.items() if f.get("dtype") == "video")
        cams = [c for c in cams if self.features.get(c, {}).get("dtype") == "video"]
        for cam in cams:
            by_file: dict[Path, list[int]] = defaultdict(list)
            for ep, row in sorted(self.episodes.items()):
                if any(f"videos/{cam}/{f}" not in row or row[f"videos/{cam}/{f}"] is None for f in VIDEO_FIELDS):
                    continue  # reported by check_episodes
                p = self._format("video_path", video_key=cam, chunk_index=int(row[f"videos/{cam}/chunk_index"]),
                                 file_index=int(row[f"videos/{cam}/file_index"]))
                if p is None:
                    return
                by_file[p].append(ep)
            for path, eps in by_file.items():
                self.guarded(f"video {path.name}", lambda cam=cam, path=path, eps=eps: self._check_video(cam, path, eps))

    def _check_video(self, cam: str, path: Path, eps: list[int]) -> None:
        import av

        if not path.is_file():
            self.error("video_file_missing", path, f"video of {cam!r} referenced by meta/episodes (episodes "
                       f"{eps[:10]}) is missing", "restore the file or re-export the dataset videos")
            return
        spans = {ep: (float(self.episodes[ep][f"videos/{cam}/from_timestamp"]),
                      float(self.episodes[ep][f"videos/{cam}/to_timestamp"])) for ep in eps}
        fps = self.fps or 0.0
        for ep, (t0, t1) in spans.items():
            length = int(self.episodes[ep]["length"])
            if not (math.isfinite(t0) and math.isfinite(t1)) or t1 <= t0 or t0 < 0:
                self.error("video_span_invalid", f"{self.episode_source[ep]}: videos/{cam}/from,to_timestamp[{ep}]",
                           f"[{t0}, {t1}] is not a valid time range", "regenerate the episode metadata")
            elif fps and abs((t1 - t0) * fps - length) > 1.0:
                self.warn("video_span_length_mismatch", f"{self.episode_source[ep]}: videos/{cam}/to_timestamp[{ep}]",
                          f"[{t0:.3f}, {t1:.3f}]s is {(t1 - t0) * fps:.1f} frames at {fps} fps but the episode has "
                          f"{length}", "regenerate the episode metadata")
        try:
            container = av.open(str(path))
        except Exception as exc:  # noqa: BLE001
            self.error("video_undecodable", path, f"cannot open video: {exc}", "re-encode the video (H.264 or AV1 mp4)")
            return
        try:
            if not container.streams.video:
                self.error("video_undecodable", path, "file has no video stream", "re-export the dataset videos")
                return
            stream = container.streams.video[0]
            self._check_video_shape(cam, path, stream)
            tb = float(stream.time_base)
            t_need = max(t1 for _, t1 in spans.values())
            period = 1.0 / fps if fps else (1.0 / float(stream.average_rate) if stream.average_rate else 0.0)
            try:
                first = next((f for f in container.decode(stream) if f.pts is not None), None)
                if first is None:
                    self.error("video_undecodable", path, "no frame could be decoded", "re-encode the video")
                    return
                # seek to the keyframe before the latest needed time, decode to the end: the last real frame
                container.seek(int(max(t_need - 2 * period - 1.0, 0.0) / tb), stream=stream, backward=True,
                               any_frame=False)
                last = None
                for frame in container.decode(stream):
                    if frame.pts is not None:
                        last = frame.pts * tb if last is None else max(last, frame.pts * tb)
            except av.FFmpegError as exc:
                self.error("video_undecodable", path, f"decoding failed: {exc}", "re-encode the video")
                return
            if last is None:
                self.error("video_undecodable", path, "no frame decoded after seeking near the end", "re-encode the video")
                return
            end = last + period  # the last frame is shown for one period
            short = sorted(ep for ep, (_, t1) in spans.items() if end < t1 - 0.5 * period - 1e-6)
            if short:
                ep = short[0]
                self.error("video_too_short", f"{path} (episode {ep})", f"video ends at {end:.3f}s (last frame at "
                           f"{last:.3f}s) but meta/episodes to_timestamp of episode {ep} is {spans[ep][1]:.3f}s "
                           f"({len(short)} episode(s) not covered)",
                           "re-encode the full video or fix from/to_timestamp in meta/episodes")
            if fps and stream.average_rate and abs(float(stream.average_rate) - fps) > 0.01 * fps:
                self.warn("video_fps_mismatch", path, f"stream rate is {float(stream.average_rate):.3f} fps but "
                          f"info.json fps is {fps}", "re-encode at the dataset fps")
        finally:
            container.close()

    def _check_video_shape(self, cam: str, path: Path, stream) -> None:
        """The loader decodes into buffers of info.json's shape and refuses frames of another size."""
        shape = list(self.features[cam].get("shape", []))
        h, w = stream.codec_context.height, stream.codec_context.width
        if h and w and shape not in ([h, w, 3], [3, h, w]):
            self.error("video_shape_mismatch", path, f"frames are {h}x{w} but meta/info.json says {cam!r} has "
                       f"shape {shape}", f"set features[{cam!r}]['shape'] to [{h}, {w}, 3] or re-encode the video")
