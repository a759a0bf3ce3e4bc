// The local file system of a job's driver JVM on a local master (stateful_runtime/runtime/
// session.py): Hadoop's LocalFileSystem, whose permissions are set by chmod(2) through Java
// instead of a `chmod` process. Without Hadoop's native library (pip's PySpark has none), Hadoop
// forks `chmod` for every file it creates and for its .crc checksum: each of Spark's checkpoint
// files (offsets, commits, state store changelogs) cost two processes and ~7 ms, on the batch's
// critical path. Built by platform/jvm-classes.sh into the venv.
package statefulruntime.hadoop;

import java.io.IOException;
import java.nio.file.Files;

import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

public final class NioLocalFileSystem extends LocalFileSystem {
  public NioLocalFileSystem() {
    super(new Raw());
  }

  /** Hadoop's raw local file system with {@code setPermission} by chmod(2). */
  public static final class Raw extends RawLocalFileSystem {
    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
      java.nio.file.Path path = pathToFile(p).toPath();
      try {
        // The "unix" view sets the whole mode (sticky bit included), as chmod does.
        Files.setAttribute(path, "unix:mode", (int) permission.toShort());
      } catch (UnsupportedOperationException | IllegalArgumentException e) {
        super.setPermission(p, permission); // (a platform without the view: Hadoop's way)
      }
    }
  }
}
