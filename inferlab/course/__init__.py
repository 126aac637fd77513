"""Course tooling: the labs' checks, the student-lab generator, the grader, the course catalog.

``checks`` (one module a lab: each exercise's feedback against an oracle), ``labgen``
(``python -m inferlab.course.labgen``: the student labs from the solved ones), ``grade``
(``python -m inferlab.course.grade``: grade submitted notebooks), ``catalog`` (pages, labs,
exercises and hints, read from the repository for the grader and the instructor guide).
"""
