"""What the file-backed sources share: paths and globs (:mod:`.paths`), the process's
bounded cache of open files (:mod:`.handles`) and the metadata index (:mod:`.metadata_index`)."""
